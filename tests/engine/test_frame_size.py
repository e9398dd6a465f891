"""2.7.1 max-frame-size: no frame the engine writes exceeds the peer's (issue 13, point 6).

Every frame's size field is read from the engine's raw output and compared with what the
peer announced (512 to 65,536), and the peer is proton, which closes the connection with a
framing error on any larger frame. Covered: transfers split to the size (2.6.14) for every
tag length 0-32 on the endpoint path guaranteed topics use (Link.send with resume and state)
and on the forwarding path with message-annotations; dispositions carrying a peer's rejected
error; ATTACH and DETACH with fields too long for a small peer (qrouter/_fast/frame_size.pxi).
"""

from __future__ import annotations

from typing import Any

import proton
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from qrouter._fast.codec import Symbol, UInt, encode
from qrouter._fast.engine import Connection, Router, target_value

from qrouter.config import AddressConfig, ListenerConfig
from tests.engine.pump import (
    AMQP_HEADER,
    ATTACH,
    CLOSE,
    DISPOSITION,
    REJECTED,
    TRANSFER,
    Peer,
    RawPeer,
    attach_frame,
    begin_frame,
    make_core,
    message_bytes,
    open_frame,
    parse_output,
    pump,
    receive,
    send,
)

SIZES = st.integers(min_value=512, max_value=65536)
TAGS = st.binary(min_size=0, max_size=32)
PROPERTY = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def frame_sizes(data: bytes) -> list[int]:
    """The size field (2.3.1) of every frame in `data`, protocol headers skipped."""
    sizes, pos = [], 0
    while pos < len(data):
        if data[pos : pos + 4] == b"AMQP":
            pos += 8
            continue
        size = int.from_bytes(data[pos : pos + 4], "big")
        assert size >= 8, f"bad frame size {size} at {pos}"
        sizes.append(size)
        pos += size
    assert pos == len(data), "output ends inside a frame"
    return sizes


def assert_fits(data: bytes, limit: int) -> None:
    sizes = frame_sizes(bytes(data))
    assert sizes, "no frames"
    assert max(sizes) <= limit, f"a frame of {max(sizes)} bytes; the peer allows {limit}"


# --- the endpoint path: an engine client sends to a proton server -------------------------


class _Quiet:
    """Engine callbacks that do nothing (the client side of this test needs none)."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args: None


class EndpointPair:
    """An engine Connection in client mode (as qrouter/client.py and guaranteed topics use
    it: Link.send with the router's tags) wired in memory to a proton server Transport."""

    def __init__(self, max_frame_size: int, credit: int = 1000) -> None:
        self.engine = Router("frame-size-client")
        self.conn = Connection(self.engine, _Quiet())
        self.transport = proton.Transport(proton.Transport.SERVER)
        self.transport.max_frame_size = max_frame_size
        self.connection = proton.Connection()
        self.connection.container = "frame-size-server"
        self.transport.bind(self.connection)
        self.from_engine = bytearray()
        self.inbound = bytearray()  # engine output proton has no room for yet
        self.conn.start()
        self.pump()
        self.connection.open()
        session = self.conn.begin()
        self.link = session.attach(
            "l", True, {"target": target_value({"address": "t"}), "snd_settle_mode": 0}
        )
        self.link.bind_endpoint()
        self.pump()
        ssn = self.connection.session_head(0)
        assert ssn is not None
        ssn.open()
        rcv = self.connection.link_head(0)
        assert rcv is not None and rcv.is_receiver
        rcv.open()
        if credit:
            rcv.flow(credit)
        self.receiver = rcv
        self.pump()
        assert self.conn.remote_max_frame_size == max_frame_size

    def pump(self) -> None:
        for _ in range(100_000):
            moved = 0
            n = self.transport.pending()
            if n > 0:
                self.conn.feed(self.transport.peek(n))
                self.transport.pop(n)
                moved += n
            out = self.conn.take_output()
            if out:
                self.from_engine += out
                self.inbound += out
            room = self.transport.capacity()
            if self.inbound and room > 0:
                self.transport.push(bytes(self.inbound[:room]))
                moved += min(room, len(self.inbound))
                del self.inbound[:room]
            if not moved:
                return
        raise AssertionError("no quiescence")


@PROPERTY
@given(
    limit=SIZES,
    tags=st.lists(TAGS, min_size=1, max_size=4, unique=True),
    size=st.integers(min_value=0, max_value=70_000),
    resume=st.booleans(),
    rejected=st.integers(min_value=0, max_value=70_000),
)
def test_endpoint_transfers_fit(
    limit: int, tags: list[bytes], size: int, resume: bool, rejected: int
) -> None:
    """Tags of 0-32 bytes (guaranteed topics use 32), payloads up to twice the largest
    size, and the first transfer's resume flag and state (2.6.13) of any length: every
    frame fits and proton reads each message whole."""
    pair = EndpointPair(limit)
    payload = bytes(i & 0xFF for i in range(size))
    state = encode(_rejected("x" * rejected) if rejected else _accepted())
    for tag in tags:
        pair.link.send(tag, payload, resume=resume, state=state)
    pair.pump()
    assert pair.transport.condition is None, pair.transport.condition
    assert_fits(pair.from_engine, limit)
    got = []
    rcv = pair.receiver
    while rcv.current is not None and not rcv.current.partial:
        d = rcv.current
        got.append(rcv.recv(d.pending) or b"")
        rcv.advance()
    assert got == [payload] * len(tags)
    # (proton's Delivery.tag decodes tags as text: read them from the frames instead)
    firsts = [
        f.fields["delivery_tag"]
        for f in parse_output(bytes(pair.from_engine))[1]
        if f.code == TRANSFER and f.fields.get("delivery_id") is not None
    ]
    assert firsts == tags


def _accepted() -> Any:
    from qrouter._fast.codec import Described, ULong

    return Described(ULong(0x24), [])


def _rejected(description: str) -> Any:
    from qrouter._fast.codec import Described, ULong

    return Described(
        ULong(REJECTED), [Described(ULong(0x1D), [Symbol("amqp:internal-error"), description])]
    )


# --- the forwarding path: producer -> router -> a consumer with a small max-frame-size -----


@PROPERTY
@given(
    limit=SIZES,
    tag=st.binary(min_size=1, max_size=32),  # (proton sends an empty tag as none)
    size=st.integers(min_value=0, max_value=70_000),
    annotation=st.integers(min_value=0, max_value=3000),
)
def test_forwarded_transfers_fit(limit: int, tag: bytes, size: int, annotation: int) -> None:
    """A multicast copy (annotations and all) to a consumer that allows `limit` bytes."""
    core = make_core(addresses=[AddressConfig(prefix="mc", distribution="multicast")])
    consumer = Peer(core, container="small", max_frame_size=limit)
    rcv = consumer.receiver("mc/t", credit=10)
    producer = Peer(core, container="big")
    snd = producer.sender("mc/t")
    pump(consumer, producer)
    body = b"b" * size
    d = snd.delivery(tag)
    snd.send(
        message_bytes(
            body, annotations={Symbol("x-opt-big"): "a" * annotation} if annotation else None
        )
    )
    snd.advance()
    pump(consumer, producer)
    assert consumer.transport.condition is None, consumer.transport.condition
    assert_fits(consumer.from_router, limit)
    got = receive(rcv)
    assert [m.body for _, m in got] == [body]
    assert d is not None


# --- dispositions and control frames ---------------------------------------------------------


@PROPERTY
@given(limit=SIZES, description=st.integers(min_value=0, max_value=65000))
def test_disposition_with_a_long_rejected_error_fits(limit: int, description: int) -> None:
    """A consumer (large frames) rejects with a long error description; the producer's
    disposition fits its `limit`: the error is dropped when it cannot (frame_size.pxi), the
    outcome stays rejected (3.4.2)."""
    core = make_core()
    consumer = Peer(core, container="big-rcv")
    rcv = consumer.receiver("q", credit=1)
    producer = Peer(core, container="small-snd", max_frame_size=limit)
    snd = producer.sender("q")
    pump(consumer, producer)
    d = send(snd, "x")
    pump(consumer, producer)
    ((cd, _),) = receive(rcv)
    cd.local.condition = proton.Condition("amqp:internal-error", "e" * description)
    cd.update(proton.Delivery.REJECTED)
    cd.settle()
    pump(consumer, producer)
    assert producer.transport.condition is None, producer.transport.condition
    assert_fits(producer.from_router, limit)
    assert d.remote_state == proton.Delivery.REJECTED
    dispositions = [
        f for f in parse_output(bytes(producer.from_router))[1] if f.code == DISPOSITION
    ]
    assert dispositions


def test_attach_that_cannot_fit_closes_with_frame_size_too_small() -> None:
    """The peer announces 512 bytes but attaches with a 1,000-character address: the
    router's ATTACH, which echoes it, cannot fit. It is not sent; the connection is closed
    with amqp:frame-size-too-small (2.8.15) in a frame that fits."""
    core = make_core()
    raw = RawPeer(core, max_frame_size=512)
    address = "a" * 1000
    raw.feed(attach_frame("long", 0, sender=False, address=address))
    names = [f.name for f in raw.frames]
    assert "close" in names and names.count("attach") == 0, names
    assert raw.close_error()[0] == "amqp:frame-size-too-small"
    # the same again, checking every frame's size field on the wire
    raw2 = RawPeer(core, max_frame_size=512)
    raw2.conn.feed(attach_frame("long2", 0, sender=False, address=address))
    data = raw2.conn.take_output()
    assert max(frame_sizes(data)) <= 512
    assert CLOSE in [f.code for f in parse_output(data)[1]]
    assert ATTACH not in [f.code for f in parse_output(data)[1]]


def test_attach_that_fits_is_unchanged() -> None:
    """The same address with a peer allowing 4,096 bytes: attached as usual."""
    core = make_core()
    raw = RawPeer(core, max_frame_size=4096)
    raw.feed(attach_frame("long", 0, sender=False, address="a" * 1000))
    assert [f.name for f in raw.frames] == ["open", "begin", "attach"]


def test_large_frames_still_allowed_to_a_large_peer() -> None:
    """The split uses the whole room a peer allows (no fixed reserve): a 60,000-byte
    message to a peer allowing 65,536 bytes travels in one frame."""
    pair = EndpointPair(65536)
    pair.link.send(b"t" * 32, b"p" * 60000)
    pair.pump()
    transfers = [s for s in frame_sizes(bytes(pair.from_engine)) if s > 1000]
    assert len(transfers) == 1 and transfers[0] <= 65536


def test_listener_limit_bounds_what_the_router_sends() -> None:
    """A peer allowing more than our listener's max-frame-size still gets frames no larger
    than the listener's (we never send what we would not accept)."""
    core = make_core()
    listener = ListenerConfig(max_frame_size=1024)
    consumer = Peer(core, container="c", listener=listener, max_frame_size=65536)
    rcv = consumer.receiver("q2", credit=1)
    producer = Peer(core, container="p")
    snd = producer.sender("q2")
    pump(consumer, producer)
    send(snd, "z" * 10000)
    pump(consumer, producer)
    assert [m.body for _, m in receive(rcv)] == ["z" * 10000]
    assert_fits(consumer.from_router, 1024)


def test_detach_and_close_errors_are_shortened_to_fit() -> None:
    """An error description longer than the peer's frames allow is cut (its condition
    kept) rather than sent oversize or not at all (frame_size.pxi)."""
    core = make_core()
    raw = RawPeer(core, max_frame_size=512)
    raw.feed(attach_frame("l", 0, sender=False, address="q"))
    (link,) = raw.conn.links()
    link.detach("amqp:internal-error", "d" * 3000)
    raw.conn.close("amqp:internal-error", "c" * 3000)
    data = raw.conn.take_output()
    assert max(frame_sizes(data)) <= 512
    frames = parse_output(data)[1]
    assert [f.name for f in frames] == ["detach", "close"]
    for f in frames:
        condition, description = f.error() or ("", "")
        assert condition == "amqp:internal-error"
        assert 300 < len(description or "") < 512


class _ResumesWithUnsettled:
    """A control plane that answers every attach with a large unsettled map, as a durable
    link's resumption does (2.6.13): 100 deliveries with 32-byte tags."""

    def __init__(self) -> None:
        self.unsettled = {bytes([i]) * 32: _accepted() for i in range(100)}

    def __getattr__(self, name: str) -> Any:
        return lambda *args: None

    def on_attach(self, conn: Any, link: Any, fields: dict[str, Any]) -> None:
        link.attach(
            {
                "source": fields["source"],
                "target": fields["target"],
                "unsettled": self.unsettled,
            }
        )


def test_attach_with_an_unsettled_map_too_large_is_sent_incomplete() -> None:
    """2.7.3 incomplete-unsettled: the map is cut to what fits and the flag set, so the peer
    knows the rest is still to come (2.6.13); the ATTACH itself fits."""
    conn = Connection(Router("r"), _ResumesWithUnsettled(), sasl_mechanisms=())
    conn.feed(AMQP_HEADER + open_frame(max_frame_size=UInt(512)) + begin_frame())
    conn.feed(attach_frame("resuming", 0, sender=False, address="x"))
    data = conn.take_output()
    assert max(frame_sizes(data)) <= 512
    (attach,) = [f for f in parse_output(data)[1] if f.code == ATTACH]
    assert attach.fields["incomplete_unsettled"] is True
    kept = attach.fields["unsettled"]
    assert 0 < len(kept) < 100 and max(frame_sizes(data)) > 400  # as many as fit
    assert all(kept[tag] == _accepted() for tag in kept)
    assert attach.fields["source"]["address"] == "x"
    # with room for it, the whole map goes
    conn = Connection(Router("r"), _ResumesWithUnsettled(), sasl_mechanisms=())
    conn.feed(AMQP_HEADER + open_frame(max_frame_size=UInt(65536)) + begin_frame())
    conn.feed(attach_frame("resuming", 0, sender=False, address="x"))
    (attach,) = [f for f in parse_output(conn.take_output())[1] if f.code == ATTACH]
    assert len(attach.fields["unsettled"]) == 100 and not attach.fields["incomplete_unsettled"]
