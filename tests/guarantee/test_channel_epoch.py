"""The channel layer of guaranteed topics (qrouter/guarantee.py), driven without sockets: the
epoch handshake between two routers' `Guarantees`, wired back to back."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from qrouter.guarantee import Guarantees


class _Mesh:
    """The one link between the two routers: what `send_eo` is given is kept, in order."""

    def __init__(self, peer: str) -> None:
        self.next_hop = {peer: 1}
        self.sent: list[dict[str, Any]] = []

    def send_eo(self, link_id: int, envelopes: list[dict[str, Any]]) -> None:
        self.sent.extend(envelopes)


def _router(name: str, peer: str, topics: tuple[str, ...]) -> Guarantees:
    table = SimpleNamespace(guarantee=lambda topic: "exactly-once" if topic in topics else None)
    core = SimpleNamespace(
        config=SimpleNamespace(id=name, guarantee_timeout=30.0),
        persistence=None,
        mesh=_Mesh(peer),
        table=table,
    )
    return Guarantees(core)  # type: ignore[arg-type]


def _deliver(sender: Guarantees, receiver: Guarantees) -> int:
    sender.flush()
    sent, sender.core.mesh.sent = sender.core.mesh.sent, []
    for envelope in sent:
        receiver.receive(envelope)
    return len(sent)


def test_a_router_with_nothing_to_say_still_moves_its_peer_into_its_epoch() -> None:
    """Issue 15 (b), seen in CI: C (no guarantee for the topic) re-opened its channel to A in a
    newer epoch when the direct link came up; A stayed in the old one, C dropped A's PINGs as
    stale and, having no topic state, never sent A anything to move it: A's barrier waited for
    C's answer for ever and A held its records. A stale envelope is now answered with an empty
    one in the newer epoch, and A's next PING gets C's LACKING."""
    a = _router("A", "C", ("events",))
    c = _router("C", "A", ())
    a.route("C", 1)
    c.route("A", 1)
    c.channels["A"].epoch = a.channels["C"].epoch + 1  # C re-routed once more than A saw
    a._out_to_router("C", {"op": "PING", "topic": "events", "e": 7})
    assert _deliver(a, c) == 1
    assert c.mismatches == set()  # dropped as from before a reset
    assert _deliver(c, a) == 1  # ... and answered, with no message, in C's epoch
    assert a.channels["C"].epoch == c.channels["A"].epoch
    assert _deliver(c, a) == 0  # once: nothing more is owed
    a._out_to_router("C", {"op": "PING", "topic": "events", "e": 8})
    _deliver(a, c)
    assert c.mismatches == {("A", "events")}
    _deliver(c, a)  # LACKING
    assert a.topics["events"].lacking_routers() == ["C"]


def test_stale_envelopes_are_answered_once_per_iteration() -> None:
    """A burst of stale envelopes costs one answer per loop iteration, not one each."""
    a = _router("A", "C", ("events",))
    c = _router("C", "A", ())
    a.route("C", 1)
    c.route("A", 1)
    c.channels["A"].epoch = a.channels["C"].epoch + 1
    for n in range(50):
        c.receive({"to": "C", "from": "A", "e": a.channels["C"].epoch, "n": n, "ms": []})
    c.flush()
    assert len(c.core.mesh.sent) == 1


def _over_the_wire(sender: Guarantees, receiver: Guarantees, mangle: Any = None) -> None:
    """What `sender` flushes, through the compact encoding, into `receiver.receive_batch`."""
    from qrouter._fast.engine import eo_pack, eo_unpack

    sender.flush()
    sent, sender.core.mesh.sent = sender.core.mesh.sent, []
    raw = eo_pack(sent)
    receiver.receive_batch(eo_unpack(mangle(raw) if mangle else raw))


def test_records_through_the_compiled_receive_loop_keep_the_channel_rules() -> None:
    """Records in sequence go to the topic's core (compiled: `receive_envelopes`); a record
    that does not decode is dropped and counted, its envelope still in sequence; an envelope
    out of sequence still resets the channel (Guarantees.receive's rules)."""
    a = _router("A", "B", ("events",))
    b = _router("B", "A", ("events",))
    a.route("B", 1)
    b.route("A", 1)
    b.topic("events")
    t = b"\x01" * 32
    fwd = ("FWD", "events", t, ("pc", "pl"), b"t1", b"body", (("B", 1, 0),))
    a._out_to_router("B", {"op": "PING", "topic": "events", "v": 1, "e": 1})
    a.outbox("B", fwd)  # into the envelope the PING opened (compiled)
    a.outbox("B", ("SEEN", "events", t, (("c", "l"),)))
    assert a.groups and len(next(iter(a.groups.values()))) == 3
    _over_the_wire(a, b)
    assert b.dropped == 0 and b.channels["A"].in_n == 1
    epoch = b.channels["A"].epoch
    a._out_to_router("B", fwd)  # (the envelope of the last iteration was sent: a new one)
    a.outbox("B", ("SETTLE", "events", t, ()))

    def unknown_op(raw: bytes) -> bytes:
        from qrouter._fast.engine import eo_pack

        at = raw.index(eo_pack(fwd)) + 5  # the FWD's op code: one nobody knows (a newer op)
        return raw[:at] + b"\x63" + raw[at + 1 :]

    _over_the_wire(a, b, unknown_op)
    assert b.dropped == 1 and b.channels["A"].in_n == 2 and b.channels["A"].epoch == epoch
    a.channels["B"].out_n += 1  # a gap: envelope #3 where #2 is expected
    a._out_to_router("B", fwd)
    _over_the_wire(a, b)
    assert b.channels["A"].epoch == epoch + 1  # reset, as before the records
