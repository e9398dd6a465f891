"""A guaranteed topic's client links in the engine (qrouter/_fast/eo_links.pxi, issue 15 item
1): the publisher's transfers and settlements and the subscribers' outcomes and settlements
reach the topic's state machine from the engine, not through the connection handler's Python
callbacks (`on_message`, `on_outcome`, `on_settled`), and the protocol behaves as before.

A real `Core` with python-qpid-proton clients wired in memory (tests/engine/pump.py); the
loop iteration's group commit (`Guarantees.flush`) is run between pumps, as the event loop
would run it."""

from __future__ import annotations

from typing import Any

import proton

from qrouter.config import AddressConfig
from qrouter.core import Core
from tests.engine.pump import Peer, Recording, make_core, pump, receive, send

TOPIC = "events"
# what the handler would be called with for a link's deliveries (the control ones stay)
PER_MESSAGE = ("on_message", "on_outcome", "on_settled")


def topic_core(guarantee: str) -> Core:
    core = make_core(
        addresses=[AddressConfig(prefix=TOPIC, distribution="multicast", guarantee=guarantee)]
    )
    return core


def settle_all(core: Core, *peers: Peer) -> None:
    """Pump and commit until nothing moves (each flush may make more frames)."""
    for _ in range(50):
        pump(*peers)
        if not (core.guarantees.outputs or core.guarantees.writes):
            return
        core.guarantees.flush()
    raise AssertionError("the guaranteed topic did not settle down")


def per_message_calls(*recordings: Recording) -> list[tuple[str, Any]]:
    return [c for r in recordings for c in r.calls if c[0] in PER_MESSAGE]


def test_exactly_once_deliveries_go_through_the_engine_not_the_handler() -> None:
    core = topic_core("exactly-once")
    sub = Peer(core, container="sub")
    pub = Peer(core, container="pub")
    recordings = [Recording(sub.conn), Recording(pub.conn)]
    rcv = sub.receiver(TOPIC, credit=10, rcv_settle_mode=proton.Link.RCV_SECOND)
    settle_all(core, sub, pub)
    snd = pub.sender(TOPIC)
    settle_all(core, sub, pub)
    assert snd.credit > 0, "the publisher got no credit"

    sent = [send(snd, f"m{i}", tag=b"t%d" % i) for i in range(3)]
    settle_all(core, sub, pub)
    got = receive(rcv)
    assert [m.body for _, m in got] == ["m0", "m1", "m2"]
    assert all(d.remote_state != proton.Delivery.ACCEPTED for d in sent), "accepted early"

    for d, _ in got:
        d.update(proton.Delivery.ACCEPTED)  # mode second: the router settles first
    settle_all(core, sub, pub)
    # every subscriber accepted: the publisher's deliveries are accepted (and, as it asked
    # for receiver-settle-mode first, settled by the router)
    assert [d.remote_state for d in sent] == [proton.Delivery.ACCEPTED] * 3
    assert all(d.settled for d in sent)
    assert all(d.settled for d, _ in got), "the router did not settle the copies"
    for d, _ in got:
        d.settle()  # in return: the subscriber has seen the settlement
    for d in sent:
        d.settle()
    settle_all(core, sub, pub)

    t = core.guarantees.topics[TOPIC]
    assert not t._origins and not t._locals, "records left after both ends settled"
    assert per_message_calls(*recordings) == []


def test_presettled_and_resent_tags_through_the_engine() -> None:
    """A presettled publisher (at most once from its side) is published; a resend of an
    accepted tag (idempotent publishing, qrouter/eo/dedup.py) gets its outcome again and is
    not delivered twice."""
    core = topic_core("at-least-once")
    sub = Peer(core, container="sub")
    pub = Peer(core, container="pub")
    recordings = [Recording(sub.conn), Recording(pub.conn)]
    rcv = sub.receiver(TOPIC, credit=10)
    settle_all(core, sub, pub)
    snd = pub.sender(TOPIC)
    settle_all(core, sub, pub)

    send(snd, "fire-and-forget", tag=b"p0", settled=True)
    first = send(snd, "once", tag=b"x1")
    settle_all(core, sub, pub)
    got = receive(rcv)
    assert [m.body for _, m in got] == ["fire-and-forget", "once"]
    for d, _ in got:
        d.update(proton.Delivery.ACCEPTED)
        d.settle()
    settle_all(core, sub, pub)
    assert first.remote_state == proton.Delivery.ACCEPTED

    again = send(snd, "once", tag=b"x1")  # its outcome was "lost": the same tag again
    settle_all(core, sub, pub)
    assert again.remote_state == proton.Delivery.ACCEPTED
    assert receive(rcv) == [], "a resend of an accepted tag was delivered again"
    assert per_message_calls(*recordings) == []


def test_a_subscriber_that_settles_first_through_the_engine() -> None:
    """A subscriber in receiver-settle-mode first settles each copy with its accept, before
    the router does: each copy stays with its link (EoSub.deliveries), marked settled by the
    peer, until the topic's settle output takes it and tells the subscriber nothing more.
    The same out tag delivered again on the link after that (a resend) is the one the next
    settle output settles; nothing is left."""
    core = topic_core("exactly-once")
    sub = Peer(core, container="sub")
    pub = Peer(core, container="pub")
    rcv = sub.receiver(TOPIC, credit=10)  # (mode first: proton's default)
    settle_all(core, sub, pub)
    snd = pub.sender(TOPIC)
    settle_all(core, sub, pub)
    sent = [send(snd, f"m{i}", tag=b"f%d" % i) for i in range(3)]
    settle_all(core, sub, pub)
    got = receive(rcv)
    assert [m.body for _, m in got] == ["m0", "m1", "m2"]
    g = core.guarantees
    (s,) = g.subs.values()
    for d, _ in got:
        d.update(proton.Delivery.ACCEPTED)
        d.settle()
    pump(sub, pub)  # (their settlements reach the engine; the commit has not run)
    assert len(s.deliveries) == 3
    assert all(d.is_remote_settled for d in s.deliveries.values())
    assert not s.peer_settled
    settle_all(core, sub, pub)
    assert [d.remote_state for d in sent] == [proton.Delivery.ACCEPTED] * 3
    assert not s.deliveries and not s.peer_settled
    assert receive(rcv) == []

    out_tag = next(iter(g.topics[TOPIC]._origins), None) or b"resent-out-tag"
    g._out_deliver(s.att, out_tag, b"\x00\x53\x77\xa1\x02m9", False)
    pump(sub, pub)
    (again,) = receive(rcv)
    again[0].update(proton.Delivery.ACCEPTED)
    again[0].settle()
    pump(sub, pub)
    g._out_deliver(s.att, out_tag, b"\x00\x53\x77\xa1\x02m9", False)  # once more, settled
    assert s.peer_settled == {out_tag}
    g._out_settle_subscriber(s.att, out_tag)
    assert not s.deliveries and not s.peer_settled
    pump(sub, pub)
    (last,) = receive(rcv)
    assert last[0].settled  # the router settled the copy sent after the peer's settlement
