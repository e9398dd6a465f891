"""Socketless harness for the wire engine (STYLE.md, "From python-qpid-proton").

A qrouter engine ``Connection`` (from ``qrouter.core.Core``) and a python-qpid-proton
``Transport`` exchange bytes in memory: ``pump`` moves them both ways until neither side has
anything to say, so protocol behaviour (credit, windows, settlement) is tested with no
sockets and no sleeps, as proton's own ``tests/proton_tests/common.py: pump`` does.

Two kinds of peer:

* ``Peer``: a proton client (Transport + Connection + Collector), the reference
  implementation; proton decides what is valid.
* ``RawPeer``: hand-built frames, for what proton will not send (bad handles, unknown
  performatives, ``unsettled`` maps, truncated frames ...). Its frames are encoded with the
  codec; the field lists below are written from the spec, not taken from the engine.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

import proton
from qrouter._fast.codec import Described, Symbol, UInt, ULong, decode, encode

from qrouter.auth import hash_password
from qrouter.config import ListenerConfig, RouterConfig
from qrouter.core import Core

# 2.2 protocol headers
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"

# 2.3.1 frame types
AMQP_FRAME = 0
SASL_FRAME = 1

# 2.7 performatives, 5.3.3 SASL frames, 2.8.14 error, 3.4 delivery states, 3.5 termini
OPEN, BEGIN, ATTACH, FLOW, TRANSFER, DISPOSITION, DETACH, END, CLOSE = range(0x10, 0x19)
ERROR = 0x1D
RECEIVED, ACCEPTED, REJECTED, RELEASED, MODIFIED = range(0x23, 0x28)
SOURCE, TARGET = 0x28, 0x29
SASL_MECHANISMS, SASL_INIT, SASL_CHALLENGE, SASL_RESPONSE, SASL_OUTCOME = range(0x40, 0x45)

# Field names, in order, of each composite type (from the spec sections cited).
SPEC_FIELDS: dict[int, tuple[str, ...]] = {
    # 2.7.1
    OPEN: (
        "container_id",
        "hostname",
        "max_frame_size",
        "channel_max",
        "idle_time_out",
        "outgoing_locales",
        "incoming_locales",
        "offered_capabilities",
        "desired_capabilities",
        "properties",
    ),
    # 2.7.2
    BEGIN: (
        "remote_channel",
        "next_outgoing_id",
        "incoming_window",
        "outgoing_window",
        "handle_max",
        "offered_capabilities",
        "desired_capabilities",
        "properties",
    ),
    # 2.7.3
    ATTACH: (
        "name",
        "handle",
        "role",
        "snd_settle_mode",
        "rcv_settle_mode",
        "source",
        "target",
        "unsettled",
        "incomplete_unsettled",
        "initial_delivery_count",
        "max_message_size",
        "offered_capabilities",
        "desired_capabilities",
        "properties",
    ),
    # 2.7.4
    FLOW: (
        "next_incoming_id",
        "incoming_window",
        "next_outgoing_id",
        "outgoing_window",
        "handle",
        "delivery_count",
        "link_credit",
        "available",
        "drain",
        "echo",
        "properties",
    ),
    # 2.7.5
    TRANSFER: (
        "handle",
        "delivery_id",
        "delivery_tag",
        "message_format",
        "settled",
        "more",
        "rcv_settle_mode",
        "state",
        "resume",
        "aborted",
        "batchable",
    ),
    # 2.7.6
    DISPOSITION: ("role", "first", "last", "settled", "state", "batchable"),
    DETACH: ("handle", "closed", "error"),  # 2.7.7
    END: ("error",),  # 2.7.8
    CLOSE: ("error",),  # 2.7.9
    ERROR: ("condition", "description", "info"),  # 2.8.14
    # 3.5.3
    SOURCE: (
        "address",
        "durable",
        "expiry_policy",
        "timeout",
        "dynamic",
        "dynamic_node_properties",
        "distribution_mode",
        "filter",
        "default_outcome",
        "outcomes",
        "capabilities",
    ),
    # 3.5.4
    TARGET: (
        "address",
        "durable",
        "expiry_policy",
        "timeout",
        "dynamic",
        "dynamic_node_properties",
        "capabilities",
    ),
    SASL_MECHANISMS: ("sasl_server_mechanisms",),  # 5.3.3.1
    SASL_INIT: ("mechanism", "initial_response", "hostname"),  # 5.3.3.2
    SASL_CHALLENGE: ("challenge",),  # 5.3.3.3
    SASL_RESPONSE: ("response",),  # 5.3.3.4
    SASL_OUTCOME: ("code", "additional_data"),  # 5.3.3.5
    REJECTED: ("error",),  # 3.4.3
    MODIFIED: ("delivery_failed", "undeliverable_here", "message_annotations"),  # 3.4.5
    RECEIVED: ("section_number", "section_offset"),  # 3.4.1
    ACCEPTED: (),  # 3.4.2
    RELEASED: (),  # 3.4.4
}


# --- building frames ------------------------------------------------------------------------


def described(code: int, **fields: Any) -> Described:
    """A described list of `code` with the named fields (trailing nulls dropped)."""
    names = SPEC_FIELDS[code]
    unknown = set(fields) - set(names)
    assert not unknown, f"unknown fields {unknown}"
    items = [fields.get(n) for n in names]
    while items and items[-1] is None:
        items.pop()
    return Described(ULong(code), items)


def frame(
    body: Described | bytes | None,
    *,
    channel: int = 0,
    ftype: int = AMQP_FRAME,
    payload: bytes = b"",
) -> bytes:
    """One frame (2.3.1): size, doff 2, type, channel, performative, payload."""
    if body is None:
        raw = b""
    elif isinstance(body, bytes):
        raw = body
    else:
        raw = encode(body)
    raw += payload
    size = 8 + len(raw)
    return size.to_bytes(4, "big") + bytes([2, ftype]) + channel.to_bytes(2, "big") + raw


def perf(code: int, *, channel: int = 0, payload: bytes = b"", **fields: Any) -> bytes:
    """A performative frame: ``perf(ATTACH, name="l", handle=UInt(0), role=False, ...)``."""
    ftype = SASL_FRAME if code >= SASL_MECHANISMS else AMQP_FRAME
    return frame(described(code, **fields), channel=channel, ftype=ftype, payload=payload)


def error(condition: str, description: str | None = None, info: Any = None) -> Described:
    return described(ERROR, condition=Symbol(condition), description=description, info=info)


def message_bytes(body: Any = None, **kw: Any) -> bytes:
    """The bare message of ``proton.Message(body=body, **kw)`` (3.2)."""
    return proton.Message(body=body, **kw).encode()


def open_frame(container: str = "raw-client", **fields: Any) -> bytes:
    return perf(OPEN, container_id=container, **fields)


def begin_frame(channel: int = 0, **fields: Any) -> bytes:
    fields.setdefault("next_outgoing_id", UInt(0))
    fields.setdefault("incoming_window", UInt(0x7FFFFFFF))
    fields.setdefault("outgoing_window", UInt(0x7FFFFFFF))
    return perf(BEGIN, channel=channel, **fields)


def attach_frame(
    name: str,
    handle: int,
    *,
    sender: bool,
    address: str | None = "q",
    channel: int = 0,
    **fields: Any,
) -> bytes:
    """An ATTACH from the peer: ``sender=True`` means the peer sends (role false)."""
    if sender:
        fields.setdefault("target", described(TARGET, address=address))
        fields.setdefault("source", described(SOURCE))
        fields.setdefault("initial_delivery_count", UInt(0))
    else:
        fields.setdefault("source", described(SOURCE, address=address))
        fields.setdefault("target", described(TARGET))
    return perf(ATTACH, channel=channel, name=name, handle=UInt(handle), role=not sender, **fields)


def transfer_frame(
    handle: int,
    delivery_id: int | None,
    tag: bytes | None,
    payload: bytes,
    *,
    channel: int = 0,
    **fields: Any,
) -> bytes:
    if tag is not None:
        fields.setdefault("message_format", UInt(0))
    return perf(
        TRANSFER,
        channel=channel,
        payload=payload,
        handle=UInt(handle),
        delivery_id=None if delivery_id is None else UInt(delivery_id),
        delivery_tag=tag,
        **fields,
    )


# --- reading frames ---------------------------------------------------------------------------


@dataclass
class Frame:
    """One frame the engine wrote, decoded with the codec."""

    ftype: int
    channel: int
    code: int | None  # descriptor code; None for an empty (heartbeat) frame
    fields: dict[str, Any] = field(default_factory=dict)
    payload: bytes = b""

    @property
    def name(self) -> str:
        return _NAMES.get(self.code, repr(self.code)) if self.code is not None else "empty"

    def error(self) -> tuple[str, str | None] | None:
        """(condition, description) of this frame's error field, if any."""
        e = self.fields.get("error")
        if e is None:
            return None
        return (str(e["condition"]), e.get("description"))


_NAMES = {
    OPEN: "open",
    BEGIN: "begin",
    ATTACH: "attach",
    FLOW: "flow",
    TRANSFER: "transfer",
    DISPOSITION: "disposition",
    DETACH: "detach",
    END: "end",
    CLOSE: "close",
    SASL_MECHANISMS: "sasl-mechanisms",
    SASL_INIT: "sasl-init",
    SASL_CHALLENGE: "sasl-challenge",
    SASL_RESPONSE: "sasl-response",
    SASL_OUTCOME: "sasl-outcome",
}


def to_dict(value: Any) -> Any:
    """A described composite as a dict of its named fields (recursively for termini/errors)."""
    if not isinstance(value, Described):
        return value
    code = int(value.descriptor) if isinstance(value.descriptor, int) else None
    names = SPEC_FIELDS.get(code) if code is not None else None
    if names is None or not isinstance(value.value, list):
        return value
    out: dict[str, Any] = {"_code": code}
    for i, name in enumerate(names):
        v = value.value[i] if i < len(value.value) else None
        out[name] = to_dict(v) if isinstance(v, Described) else v
    return out


def parse_output(data: bytes) -> tuple[list[bytes], list[Frame]]:
    """Split what the engine wrote into protocol headers and decoded frames."""
    headers: list[bytes] = []
    frames: list[Frame] = []
    pos = 0
    while pos < len(data):
        if data[pos : pos + 4] == b"AMQP":
            headers.append(data[pos : pos + 8])
            pos += 8
            continue
        size = int.from_bytes(data[pos : pos + 4], "big")
        assert size >= 8 and pos + size <= len(data), f"bad frame at {pos}: {data[pos:]!r}"
        doff, ftype = data[pos + 4], data[pos + 5]
        channel = int.from_bytes(data[pos + 6 : pos + 8], "big")
        body = data[pos + doff * 4 : pos + size]
        pos += size
        if not body:
            frames.append(Frame(ftype, channel, None))
            continue
        value, end = decode(body)
        assert isinstance(value, Described), value
        frames.append(Frame(ftype, channel, int(value.descriptor), to_dict(value), body[end:]))
    return headers, frames


# --- engine set-up ----------------------------------------------------------------------------


def make_core(**config: Any) -> Core:
    config.setdefault("id", "r1")
    return Core(RouterConfig(**config))


def users_file(users: dict[str, str], directory: str | None = None) -> str:
    """A users file (qrouter/auth.py format) with cheap hashes; returns its path."""
    fd, path = tempfile.mkstemp(prefix="qrouter-users-", dir=directory)
    with os.fdopen(fd, "w") as f:
        for user, password in users.items():
            f.write(f"{user}:{hash_password(password, iterations=1)}\n")
    return path


# --- a proton peer ----------------------------------------------------------------------------


class Peer:
    """A proton client wired (in memory) to its own engine Connection of `core`."""

    def __init__(
        self,
        core: Core,
        *,
        listener: ListenerConfig | None = None,
        container: str = "client",
        sasl: str | tuple[str, str] | None = None,
        max_frame_size: int | None = None,
        channel_max: int | None = None,
        idle_timeout: float | None = None,
        open: bool = True,
    ) -> None:
        self.core = core
        self.conn = core.new_connection(listener or ListenerConfig())
        self.transport = proton.Transport()
        if max_frame_size is not None:
            self.transport.max_frame_size = max_frame_size
        if channel_max is not None:
            self.transport.channel_max = channel_max
        if idle_timeout is not None:
            self.transport.idle_timeout = idle_timeout
        if sasl is not None:
            s = self.transport.sasl()
            if sasl == "ANONYMOUS":
                s.allowed_mechs("ANONYMOUS")
            else:
                s.allowed_mechs("PLAIN")
                s.allow_insecure_mechs = True
        self.connection = proton.Connection()
        self.connection.container = container
        if isinstance(sasl, tuple):
            self.connection.user, self.connection.password = sasl
        self.collector = proton.Collector()
        self.connection.collect(self.collector)
        self.transport.bind(self.connection)
        self.to_router = bytearray()  # everything proton wrote
        self.from_router = bytearray()  # everything the engine wrote
        self.inbound = bytearray()  # engine output proton has no room for yet
        self.eof_sent = False
        if open:
            self.connection.open()

    # -- moving bytes --

    def step(self) -> int:
        """Move what is pending in each direction once; returns the bytes moved."""
        moved = 0
        n = self.transport.pending()
        if n > 0:
            data = self.transport.peek(n)
            self.transport.pop(n)
            self.to_router += data
            self.conn.feed(data)
            moved += n
        out = self.conn.take_output()
        assert isinstance(out, bytes)
        if out:
            self.from_router += out
            self.inbound += out
            moved += len(out)
        while self.inbound:
            room = self.transport.capacity()
            if room < 0:
                self.inbound.clear()  # proton closed its input: the bytes are lost
                break
            if room == 0:
                break
            chunk = bytes(self.inbound[:room])
            self.transport.push(chunk)
            del self.inbound[:room]
            moved += len(chunk)
        if self.conn.closed and not self.eof_sent and not out and not self.inbound:
            # the router closed its socket: proton reads end-of-stream
            self.eof_sent = True
            if self.transport.capacity() >= 0:
                self.transport.close_tail()
            moved += 1
        return moved

    def pump(self) -> None:
        pump(self)

    # -- proton-side conveniences --

    def events(self) -> list[str]:
        """Drain the collector: the names of the events seen since the last call."""
        out = []
        while True:
            e = self.collector.peek()
            if e is None:
                return out
            out.append(e.type.name)
            self.collector.pop()

    def session(self, incoming_capacity: int | None = None) -> proton.Session:
        s = self.connection.session()
        if incoming_capacity is not None:
            s.incoming_capacity = incoming_capacity
        s.open()
        return s

    def sender(
        self,
        address: str | None,
        name: str = "sender",
        *,
        session: proton.Session | None = None,
        target_durable: int = 0,
        **modes: Any,
    ) -> proton.Sender:
        """target_durable: the target's durability (3.5.5); 2 (unsettled-state) is what the
        router wants before it grants rcv-settle-mode second (docs/client.md)."""
        snd = (session or self.session()).sender(name)
        if address is not None:
            snd.target.address = address
        snd.target.durability = target_durable
        for k, v in modes.items():
            setattr(snd, k, v)
        snd.open()
        return snd

    def receiver(
        self,
        address: str | None,
        name: str = "receiver",
        *,
        credit: int = 0,
        session: proton.Session | None = None,
        dynamic: bool = False,
        **modes: Any,
    ) -> proton.Receiver:
        rcv = (session or self.session()).receiver(name)
        if dynamic:
            rcv.source.dynamic = True
        elif address is not None:
            rcv.source.address = address
        for k, v in modes.items():
            setattr(rcv, k, v)
        rcv.open()
        if credit:
            rcv.flow(credit)
        return rcv

    def frames_from_router(self) -> list[Frame]:
        return parse_output(bytes(self.from_router))[1]


def pump(*peers: Peer, max_rounds: int = 10_000) -> None:
    """Move bytes between every proton peer and its engine Connection until all are quiet.

    The engine forwards between connections of one Core synchronously in feed(), so a round
    over all peers lets a message travel producer -> router -> consumer."""
    for _ in range(max_rounds):
        if not sum(p.step() for p in peers):
            return
    raise AssertionError("pump did not reach quiescence")


def send(
    snd: proton.Sender,
    body: Any = None,
    *,
    tag: bytes | None = None,
    settled: bool = False,
    **props: Any,
) -> proton.Delivery:
    """Send one whole message on a proton sender (returns its delivery)."""
    d = snd.delivery(tag if tag is not None else os.urandom(8))
    snd.send(message_bytes(body, **props))
    snd.advance()
    if settled:
        d.settle()
    return d


def receive(rcv: proton.Receiver) -> list[tuple[proton.Delivery, proton.Message]]:
    """Every complete delivery waiting on a proton receiver, with its decoded message."""
    out = []
    while True:
        d = rcv.current
        if d is None or d.partial or not d.readable:
            return out
        m = proton.Message()
        m.decode(rcv.recv(d.pending))
        if isinstance(m.body, memoryview):
            m.body = bytes(m.body)
        rcv.advance()
        out.append((d, m))


# --- a raw peer ------------------------------------------------------------------------------


class RawPeer:
    """Hand-built frames fed straight to an engine Connection; its output decoded."""

    def __init__(
        self,
        core: Core,
        listener: ListenerConfig | None = None,
        *,
        handshake: bool = True,
        max_frame_size: int | None = None,
        container: str = "raw-client",
    ) -> None:
        self.core = core
        self.conn = core.new_connection(listener or ListenerConfig())
        self.headers: list[bytes] = []
        self.frames: list[Frame] = []
        if handshake:
            self.feed(AMQP_HEADER)
            self.feed(
                open_frame(
                    container,
                    max_frame_size=None if max_frame_size is None else UInt(max_frame_size),
                )
            )
            self.feed(begin_frame())
            names = [f.name for f in self.frames]
            assert names == ["open", "begin"], names

    def feed(self, data: bytes) -> list[Frame]:
        """Feed bytes; returns the frames the engine wrote in answer (kept in .frames too)."""
        self.conn.feed(data)
        out = self.conn.take_output()
        assert isinstance(out, bytes)
        headers, frames = parse_output(out)
        self.headers += headers
        self.frames += frames
        return frames

    def collect(self) -> list[Frame]:
        """What the engine wrote without being fed (after an API call such as close())."""
        return self.feed(b"")

    def close_error(self) -> tuple[str, str | None] | None:
        """The error of the CLOSE the engine wrote, if it wrote one."""
        for f in self.frames:
            if f.code == CLOSE:
                return f.error()
        return None

    def of(self, code: int) -> list[Frame]:
        return [f for f in self.frames if f.code == code]


def assert_engine_usable(core: Core) -> None:
    """A fresh proton connection on `core` still opens, attaches and moves a message."""
    a = Peer(core, container="health-check")
    rcv = a.receiver("health", "health-rcv", credit=1)
    snd = a.sender("health", "health-snd")
    pump(a)
    assert snd.credit > 0, snd.credit
    d = send(snd, "ok")
    pump(a)
    got = receive(rcv)
    assert [m.body for _, m in got] == ["ok"]
    got[0][0].update(proton.Delivery.ACCEPTED)
    got[0][0].settle()
    pump(a)
    assert d.remote_state == proton.Delivery.ACCEPTED
    a.connection.close()
    pump(a)
    assert a.conn.closed


def settle_range(
    first: int, last: int | None = None, outcome: int = ACCEPTED, **fields: Any
) -> bytes:
    """A receiver's settled DISPOSITION (2.7.6) of delivery-ids first..last with `outcome`
    (a 3.4 code: ACCEPTED, RELEASED, ...)."""
    if last is not None:
        fields["last"] = UInt(last)
    return perf(
        DISPOSITION, role=True, first=UInt(first), settled=True, state=described(outcome), **fields
    )


def flow_frame(
    *,
    channel: int = 0,
    next_incoming_id: int | None = 0,
    incoming_window: int = 0x7FFFFFFF,
    next_outgoing_id: int = 0,
    outgoing_window: int = 0x7FFFFFFF,
    handle: int | None = None,
    delivery_count: int | None = None,
    link_credit: int | None = None,
    **fields: Any,
) -> bytes:
    """A FLOW (2.7.4); session fields default to wide-open windows."""

    def u(v: int | None) -> UInt | None:
        return None if v is None else UInt(v)

    return perf(
        FLOW,
        channel=channel,
        next_incoming_id=u(next_incoming_id),
        incoming_window=UInt(incoming_window),
        next_outgoing_id=UInt(next_outgoing_id),
        outgoing_window=UInt(outgoing_window),
        handle=u(handle),
        delivery_count=u(delivery_count),
        link_credit=u(link_credit),
        **fields,
    )


class Recording:
    """Wraps an engine Connection's handler and records the control callbacks it gets."""

    def __init__(self, conn: Any) -> None:
        self.inner = conn.handler
        self.calls: list[tuple[str, Any]] = []
        conn.handler = self

    def __getattr__(self, name: str) -> Any:
        inner = getattr(self.inner, name)

        def call(*args: Any) -> Any:
            self.calls.append((name, args[1:]))
            return inner(*args)

        return call

    def of(self, name: str) -> list[Any]:
        return [args for n, args in self.calls if n == name]
