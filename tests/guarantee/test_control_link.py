"""Guaranteed topics' batches on an inter-router control link, received in the engine
(qrouter/_fast/eo_control.pxi, issue 15 item 2): once the neighbour is up, a batch as
`Mesh.send_eo` writes it goes from the control link to the compiled receive with no Python
frame, and everything else (the routing protocol, malformed or hostile batches, envelopes
from a router not behind the connection, a link that is not the peer's control link, a peer
not up yet) goes through `Mesh.on_message` with the checks it had.

A real `Core` with its `Mesh` and a hand-built neighbour "A" (tests/engine/pump.py RawPeer:
OPEN as a router, both control links, HELLO and link state), in memory."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from qrouter._fast.codec import Described, ULong, decode, encode
from qrouter._fast.engine import eo_pack

from qrouter.config import AddressConfig, ListenerConfig
from qrouter.core import Core
from qrouter.inter_router import (
    AMQP_VALUE,
    CONTROL_ADDRESS,
    CONTROL_LINK,
    EO_OP,
    P_ID,
    P_INSTANCE,
    P_ROLE,
    ROLE,
    Mesh,
    Peer,
    eo_envelopes,
)
from qrouter.mesh.messages import Hello, LinkStateUpdate
from tests.engine.pump import (
    AMQP_HEADER,
    RawPeer,
    Recording,
    attach_frame,
    begin_frame,
    make_core,
    open_frame,
    transfer_frame,
)
from tests.eo.wire_values import wire_values as _wire_values

TOPIC = "events"


class Neighbour:
    """Router "A" on an inter-router connection to the core's router "B", by hand."""

    def __init__(self, core: Core, loop: asyncio.AbstractEventLoop, *, up: bool = True) -> None:
        self.core = core
        self.loop = loop
        self.raw = RawPeer(core, ListenerConfig(role="inter-router"), handshake=False)
        self.raw.feed(AMQP_HEADER)
        props = {P_ROLE: ROLE, P_ID: "A", P_INSTANCE: ULong(7)}
        self.raw.feed(open_frame("A", properties=props))
        self.raw.feed(begin_frame())
        self.run()  # B begins its session and attaches its control sender
        self.sent = 0
        self.handles = 0
        self.attach_control()
        if up:
            self.answer()

    def run(self) -> None:
        self.loop.run_until_complete(asyncio.sleep(0))

    @property
    def peer(self) -> Peer:
        assert self.core.mesh is not None
        (peer,) = self.core.mesh.peers.values()
        return peer

    def attach_control(self, name: str = CONTROL_LINK) -> int:
        """A's control sender (B's ctl_in); returns its handle."""
        handle = self.handles
        self.handles += 1
        self.raw.feed(attach_frame(name, handle, sender=True, address=CONTROL_ADDRESS))
        return handle

    def answer(self) -> None:
        """Answer B's control sender (its session is B's channel 1): B is then up."""
        self.raw.feed(begin_frame(1, remote_channel=1))
        self.raw.feed(
            attach_frame(CONTROL_LINK, 0, sender=False, address=CONTROL_ADDRESS, channel=1)
        )

    def send(self, payload: bytes, handle: int = 0) -> None:
        self.raw.feed(transfer_frame(handle, self.sent, b"%d" % self.sent, payload, settled=True))
        self.sent += 1

    def say(self, message: dict[str, Any], handle: int = 0) -> None:
        self.send(encode(Described(AMQP_VALUE, message)), handle)

    def routes(self) -> None:
        """HELLO and link state: B is adjacent to A and has a route (and a channel) to it."""
        self.say(Hello("A", 7, ("B",)).to_wire())
        self.say(LinkStateUpdate("A", 7, 1, {"B": 1}).to_wire())
        assert self.core.mesh is not None
        self.core.mesh.engine.tick(self.loop.time())
        ch = self.core.guarantees.channels["A"]
        assert ch.up
        # the first batch after the routes changed goes through Mesh.on_message, whose
        # origin check (RoutingEngine.behind) notes who is behind the link; the next ones not
        self.send(batch([{"to": "B", "from": "A", "e": ch.epoch, "n": 0, "ms": []}]))
        assert ch.in_n == 1
        ch.in_n = 0


def batch(envelopes: Any) -> bytes:
    """A control message as `Mesh.send_eo` writes it."""
    return encode(Described(AMQP_VALUE, {"op": EO_OP, "b": eo_pack(envelopes)}))


@pytest.fixture
def core() -> Iterator[Core]:
    core = make_core(
        id="B",
        addresses=[AddressConfig(prefix=TOPIC, distribution="multicast", guarantee="exactly-once")],
    )
    loop = asyncio.new_event_loop()
    core.mesh = Mesh(core)
    core.mesh.loop = loop
    yield core
    loop.close()


@pytest.fixture
def a(core: Core) -> Neighbour:
    assert core.mesh is not None and core.mesh.loop is not None
    a = Neighbour(core, core.mesh.loop)
    a.routes()
    return a


def envelope(core: Core, n: int | None = None, src: str = "A", **kw: Any) -> dict[str, Any]:
    ch = core.guarantees.channels["A"]
    return {"to": "B", "from": src, "e": ch.epoch, "n": ch.in_n if n is None else n, "ms": []} | kw


def test_batches_are_received_in_the_engine_with_the_channel_rules(a: Neighbour) -> None:
    core = a.core
    recording = Recording(a.raw.conn)
    ch = core.guarantees.channels["A"]
    epoch = ch.epoch
    ping = {"op": "PING", "topic": TOPIC, "v": 1, "e": 3}
    a.send(batch([envelope(core, ms=[ping]), envelope(core, n=1)]))
    assert ch.in_n == 2 and ch.epoch == epoch
    # the PING reached the guarantees (no state for the topic here: a PONG at once)
    answers = [m for group in core.guarantees.groups.values() for m in group]
    assert [m["op"] for m in answers] == ["PONG"]
    a.send(batch([envelope(core, n=ch.in_n + 1)]))  # a gap: the channel resets
    assert ch.epoch == epoch + 1 and ch.in_n == 0
    assert recording.of("on_message") == [], "a batch went through the Python handler"
    assert a.peer.ctl_entry is not None and a.peer.ctl_entry.taken == 2
    # the routing protocol still goes to Python
    a.say(Hello("A", 7, ("B",)).to_wire())
    assert len(recording.of("on_message")) == 1


def test_the_map_in_any_other_encoding_is_read_as_before(a: Neighbour) -> None:
    """The engine takes the map in either order of its keys, as a map8 or map32, "b" as a
    vbin8 or vbin32; any other shape (a third key, no amqp-value descriptor, the AMQP list of
    routers before the compact form) goes to Mesh.on_message and is received all the same."""
    core = a.core
    ch = core.guarantees.channels["A"]
    raw = eo_pack([envelope(core)])
    key_op, key_b = b"\xa1\x02op", b"\xa1\x01b"
    op, vbin = b"\xa1\x02EO", b"\xb0" + len(raw).to_bytes(4, "big") + raw
    body = key_b + vbin + key_op + op
    map32 = b"\xd1" + (len(body) + 4).to_bytes(4, "big") + b"\x00\x00\x00\x04" + body
    before = a.peer.ctl_entry.taken if a.peer.ctl_entry else 0
    a.send(b"\x00\x53\x77" + map32)
    assert ch.in_n == 1
    assert a.peer.ctl_entry is not None and a.peer.ctl_entry.taken == before + 1
    passed = a.peer.ctl_entry.passed
    a.send(encode(Described(AMQP_VALUE, {"b": eo_pack([envelope(core)]), "op": EO_OP, "x": 1})))
    assert ch.in_n == 2  # a third key: Python's path, which ignores it
    a.send(encode({"op": EO_OP, "b": eo_pack([envelope(core)])}))  # no amqp-value descriptor
    assert ch.in_n == 3
    a.send(encode({"op": EO_OP, "m": [envelope(core)]}))  # a router before the compact form
    assert ch.in_n == 4
    assert a.peer.ctl_entry.passed == passed + 3 and a.peer.ctl_entry.taken == before + 1


MALFORMED: dict[str, Any] = {
    "b does not decode": lambda c: {"op": EO_OP, "b": b"\x07"},
    "b is not binary": lambda c: {"op": EO_OP, "b": "text"},
    "b is not a list": lambda c: {"op": EO_OP, "b": eo_pack({"to": "B"})},
    "b has trailing bytes": lambda c: {"op": EO_OP, "b": eo_pack([envelope(c)]) + b"\x00"},
    "b is truncated": lambda c: {"op": EO_OP, "b": eo_pack([envelope(c)])[:-1]},
    "b claims 2^32-1 values": lambda c: {"op": EO_OP, "b": b"\x06\xff\xff\xff\xff\x00"},
    "b nests too deep": lambda c: {"op": EO_OP, "b": b"\x06\x00\x00\x00\x01" * 40 + b"\x00"},
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_batches_are_dropped_and_counted(a: Neighbour, name: str) -> None:
    core = a.core
    ch = core.guarantees.channels["A"]
    dropped = core.guarantees.dropped
    a.say(MALFORMED[name](core))
    assert core.guarantees.dropped == dropped + 1
    assert ch.in_n == 0
    a.send(batch([envelope(core)]))  # and the channel goes on
    assert ch.in_n == 1


@pytest.mark.parametrize(
    "cut",
    [
        lambda p: p[:-1],  # the binary shorter than its length
        lambda p: p[:7],  # inside the map's header
        lambda p: p[:3] + b"\xc1\xff\x04" + p[6:],  # a map8 size past the end
        lambda p: p[:3] + b"\xd1\xff\xff\xff\xff\x00\x00\x00\x04",  # a map32 of 4 GiB
        lambda p: p[:-6] + b"\xb0\xff\xff\xff\xff\x00",  # a vbin32 of 4 GiB
    ],
)
def test_truncated_or_oversized_payloads_are_dropped_and_counted(a: Neighbour, cut: Any) -> None:
    core = a.core
    assert core.mesh is not None
    ch = core.guarantees.channels["A"]
    payload = batch([envelope(core)])
    dropped = core.mesh.dropped + core.guarantees.dropped
    a.send(cut(payload))
    assert core.mesh.dropped + core.guarantees.dropped == dropped + 1
    assert ch.in_n == 0
    a.send(payload)
    assert ch.in_n == 1


def test_envelopes_from_a_router_not_behind_the_connection_are_refused(a: Neighbour) -> None:
    core = a.core
    assert core.mesh is not None
    ch = core.guarantees.channels["A"]
    a.send(batch([envelope(core, src="C")]))
    assert core.mesh.refused["eo-origin"] == 1 and ch.in_n == 0
    a.send(batch([envelope(core, src="C"), envelope(core)]))  # the others of it are kept
    assert core.mesh.refused["eo-origin"] == 2 and ch.in_n == 1
    a.send(batch([envelope(core, src=None)]))  # type: ignore[arg-type]
    assert core.mesh.refused["eo-origin"] == 3 and ch.in_n == 1


def test_only_the_peers_current_control_link_is_read(a: Neighbour) -> None:
    """A second control link from the neighbour replaces the first: what comes on the first
    is ignored, as before; the second is received in the engine."""
    core = a.core
    ch = core.guarantees.channels["A"]
    first = a.peer.ctl_entry
    second = a.attach_control("qr.control.2")
    assert a.peer.ctl_entry is not first and first is not None
    a.send(batch([envelope(core)]), handle=0)
    assert ch.in_n == 0 and first.taken == 0
    a.send(batch([envelope(core)]), handle=second)
    assert ch.in_n == 1 and a.peer.ctl_entry is not None and a.peer.ctl_entry.taken == 1


def test_a_peer_not_up_keeps_its_messages_until_it_is(core: Core) -> None:
    assert core.mesh is not None and core.mesh.loop is not None
    a = Neighbour(core, core.mesh.loop, up=False)
    message = {"op": EO_OP, "b": eo_pack([{"to": "B", "from": "A", "e": 1, "n": 0, "ms": []}])}
    a.say(message)
    assert not a.peer.up and a.peer.ctl_entry is None
    assert a.peer.early == [message]
    a.answer()
    assert a.peer.up and a.peer.early == [] and a.peer.ctl_entry is not None


def test_credit_is_topped_up_below_half(a: Neighbour) -> None:
    core = a.core
    link = a.peer.ctl_in
    assert link is not None
    for _ in range(600):
        a.send(batch([envelope(core)]))
    assert core.guarantees.channels["A"].in_n == 600
    assert link.credit >= 500  # granted again at 499: A never runs out


# -- the engine takes exactly what Python reads the same way ----------------------------------


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.data())
def test_what_the_engine_takes_python_reads_the_same(a: Neighbour, data: st.DataObject) -> None:
    """Any payload (a batch with octets changed, cut or added): when the engine takes it,
    Mesh.on_message would have read the same envelopes, all of them from behind A."""
    core = a.core
    assert core.mesh is not None
    entry = a.peer.ctl_entry
    assert entry is not None
    payload = bytearray(batch([envelope(core), envelope(core, n=1, ms=[("x",)])]))
    for _ in range(data.draw(st.integers(0, 3))):
        if not payload:
            break
        at = data.draw(st.integers(0, len(payload) - 1))
        how = data.draw(st.sampled_from(["set", "cut", "insert"]))
        if how == "set":
            payload[at] = data.draw(st.integers(0, 255))
        elif how == "cut":
            del payload[at:]
        else:
            payload[at:at] = data.draw(st.binary(min_size=1, max_size=4))
    taken = entry.take(bytes(payload))
    if taken is None:
        return
    value, _ = decode(bytes(payload))
    message = value.value if isinstance(value, Described) else value
    assert isinstance(message, dict) and message.get("op") == EO_OP
    assert eo_envelopes(message) == taken
    assert all(core.mesh.engine.behind(a.peer.link_id, e["from"]) for e in taken)


# -- what Mesh.send_eo writes ------------------------------------------------------------------

wire_values = _wire_values(300)


@settings(max_examples=300, deadline=None)
@given(wire_values)
def test_send_eo_writes_the_octets_of_the_map_it_sent_before(value: Any) -> None:
    """Mixed versions: `eo_message` is octet for octet the AMQP encoding of the map a router
    before it sent ({"op": "EO", "b": eo_pack(...)}), map8 and map32, vbin8 and vbin32."""
    from qrouter._fast.engine import eo_message

    assert eo_message(value) == encode(Described(AMQP_VALUE, {"op": EO_OP, "b": eo_pack(value)}))


def test_send_eo_at_the_encodings_edges() -> None:
    from qrouter._fast.engine import eo_message

    for n in [*range(225, 262), 65536]:  # map8 up to 248 octets of pairs, vbin8 up to 255
        value = b"x" * n
        assert eo_message(value) == encode(
            Described(AMQP_VALUE, {"op": EO_OP, "b": eo_pack(value)})
        )
    with pytest.raises(ValueError):
        eo_message([1.5])


def test_names_decode_to_the_same_str_and_any_names_round_trip() -> None:
    """The decoder's cache of names (eo_wire.pxi `_eo_str`): a name seen again is the same str;
    more distinct names than it has slots, names sharing a slot, long and non-ASCII names all
    decode to what was encoded."""
    from qrouter._fast.engine import eo_unpack

    names = [f"router-{i}" for i in range(2000)] + ["é" * 40, "x" * 200, "", "ü"]
    first = eo_unpack(eo_pack(names))
    assert first == names
    again = eo_unpack(eo_pack(names[-300:]))
    assert again == names[-300:]
    fwd = ("FWD", "events", b"t", ("c", "l"), b"tag", b"body", (("B", 1, 2),))
    one, two = eo_unpack(eo_pack([fwd, fwd]))
    assert one == two == fwd and one[1] is two[1] and one[3][0] is two[3][0]
