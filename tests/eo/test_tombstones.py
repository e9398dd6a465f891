"""Exactly-once's tombstones (qrouter/_fast/eo_core.pyx): a settled local record that every
subscriber here has seen stays until the PING barrier passes, and while it does, a FWD of it
again (a resend after a broken channel) delivers nothing, a SETTLE again is answered SEEN, a
subscriber that comes back with it unsettled is settled (and SEEN follows its settlement), and
the barrier lets it go. What a change to how tombstones are kept must still do."""

from __future__ import annotations

from typing import Any

from qrouter.eo import outgoing_tag
from tests.eo.test_protocol import S1, Net, P


def _op(msg: Any) -> str:
    return str(msg[0] if isinstance(msg, tuple) else msg["op"])


def _settled_at_b() -> tuple[Net, Any, bytes, list[tuple[str, str, Any]]]:
    """A publisher on A, a subscriber on B: one message delivered, accepted and settled, the
    wire's A -> B messages kept (the FWD and SETTLE to send again)."""
    net = Net("AB")
    b1 = net.r["B"].subscriber_attached(S1, [], 0.0, resumable=False)
    net.pump()
    net.r["A"].publisher_attached(P, [], 0.0)
    net.r["A"].publisher_transfer(P, b"t1", b"m1", 0.0)
    kept: list[tuple[str, str, Any]] = []
    while net.wire:
        src, dst, msg = net.wire.popleft()
        if src == "A":
            kept.append((src, dst, msg))
        net.r[dst].receive(src, msg, 0.0)
    t = outgoing_tag(*P, b"t1")
    assert [d[1:3] for d in net.take("deliver")] == [(b1, t)]
    net.r["B"].subscriber_accepted(b1, t, 0.0)
    while net.wire:
        src, dst, msg = net.wire.popleft()
        if src == "A":
            kept.append((src, dst, msg))
        net.r[dst].receive(src, msg, 0.0)
    assert net.take("accept") == [("accept", P, b"t1")]
    net.r["A"].publisher_settled(P, b"t1", 0.0)
    while net.wire:
        src, dst, msg = net.wire.popleft()
        if src == "A":
            kept.append((src, dst, msg))
        net.r[dst].receive(src, msg, 0.0)
    assert [s[1] for s in net.take("settle")] == [b1]
    return net, b1, t, kept


def _tombstone(net: Net, t: bytes) -> bool:
    # (read from the local records, where tombstones are kept today: a change that keeps
    # them elsewhere changes this helper, not the tests' observable checks)
    rec = net.r["B"].local_records().get(t)
    return rec is not None and rec.settled and rec.all_seen()


def test_a_tombstone_suppresses_a_fwd_again_until_the_barrier() -> None:
    net, _b1, t, kept = _settled_at_b()
    b = net.r["B"]
    assert _tombstone(net, t)  # seen by all here, the barrier not passed
    fwd = [m for m in kept if _op(m[2]) == "FWD"]
    assert fwd, "no FWD from A"
    for src, _dst, msg in fwd:  # the FWD again (a resend after a broken channel)
        b.receive(src, msg, 0.0)
    assert net.take("deliver") == [] and _tombstone(net, t)
    settle = [m for m in kept if _op(m[2]) == "SETTLE"]
    assert settle, "no SETTLE from A"
    net.wire.clear()
    for src, _dst, msg in settle:  # the SETTLE again: SEEN again, nothing settled again
        b.receive(src, msg, 0.0)
    assert [_op(m[2]) for m in net.wire] == ["SEEN"] and net.take("settle") == []
    net.pump()
    for n in "AB":  # the barrier: one PING/PONG round, then the tick drops it
        net.r[n].tick(1.0)
    net.pump()
    for n in "AB":
        net.r[n].tick(2.0)
    assert b.local_records() == {}


def test_a_subscriber_back_with_a_tombstone_unsettled_is_settled() -> None:
    """A subscriber that attaches with the settled delivery in its unsettled map (one that
    never saw the settlement on its link; here another link, ("s9", "l"), after the first
    detached) is settled, and SEEN goes to A once it settles: the tombstone is a record in
    flight again until then."""
    net, b1, t, _kept = _settled_at_b()
    b = net.r["B"]
    b.subscriber_detached(b1, False, 0.0)
    net.pump()
    assert _tombstone(net, t)  # (the barrier has not passed: kept)
    b2 = b.subscriber_attached(("s9", "l"), [(t, True)], 0.0)
    assert net.take("settle") == [("settle", b2, t)]
    assert not _tombstone(net, t)  # (its new subscriber has not seen it)
    net.wire.clear()
    b.subscriber_settled(b2, t, 0.0)
    assert [(m[1], _op(m[2])) for m in net.wire] == [("A", "SEEN")]
    assert _tombstone(net, t)  # seen by all here again
