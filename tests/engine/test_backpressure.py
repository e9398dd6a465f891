"""Backpressure in the engine, in memory (issue 13, qrouter/_fast/backpressure.pxi): a
connection whose write buffer is full (the server forwards asyncio's pause_writing) gets no
new deliveries, its producers get no new credit (2.6.7: the router, as receiver, decides the
credit it grants), and everything waits in the router, bounded, until resume_writing."""

from __future__ import annotations

from typing import Any

import pytest

from qrouter.config import AddressConfig
from tests.engine.pump import Peer, make_core, pump, receive, send

CAPACITY = 20  # link_capacity: the most credit one producer link gets


@pytest.fixture
def core():  # type: ignore[no-untyped-def]
    return make_core(
        link_capacity=CAPACITY,
        addresses=[AddressConfig(prefix="mc", distribution="multicast")],
    )


def bodies(rcv: Any) -> list[Any]:
    got = receive(rcv)
    for d, _m in got:
        d.update(d.ACCEPTED)
        d.settle()
    return [m.body for _d, m in got]


def send_all(snd: Any, start: int, settled: bool = True) -> int:
    """Send numbered messages while the producer has credit; returns the next number."""
    i = start
    while snd.credit > 0:
        send(snd, i, settled=settled)
        i += 1
    return i


def test_paused_consumer_stops_producer_credit_and_nothing_is_lost(core) -> None:  # type: ignore[no-untyped-def]
    consumer = Peer(core)
    rcv = consumer.receiver("bp.q", credit=1_000_000)
    producer = Peer(core)
    snd = producer.sender("bp.q")
    pump(consumer, producer)
    assert snd.credit == CAPACITY
    consumer.conn.pause_writing()
    assert consumer.conn.write_paused and consumer.conn.n_write_pauses == 1
    n = send_all(snd, 0)
    pump(consumer, producer)
    # the presettled deliveries wait in the router; the producer is not topped up
    assert bodies(rcv) == []
    assert snd.credit == 0 and n == CAPACITY
    assert core.engine.address("bp.q").undelivered_count == CAPACITY
    consumer.conn.pause_writing()  # a second call changes nothing
    assert consumer.conn.n_write_pauses == 1
    consumer.conn.resume_writing()
    pump(consumer, producer)
    assert bodies(rcv) == list(range(CAPACITY))  # every one, in order
    assert snd.credit == CAPACITY  # credit flows again
    n2 = send_all(snd, n)
    pump(consumer, producer)
    assert bodies(rcv) == list(range(n, n2))
    assert core.engine.n_write_pauses == 1


def test_balanced_prefers_a_consumer_that_is_not_paused(core) -> None:  # type: ignore[no-untyped-def]
    slow, fast = Peer(core, container="slow"), Peer(core, container="fast")
    rcv_slow = slow.receiver("bp.b", credit=1000)
    rcv_fast = fast.receiver("bp.b", credit=1000)
    producer = Peer(core)
    snd = producer.sender("bp.b")
    pump(slow, fast, producer)
    slow.conn.pause_writing()
    for round_ in range(3):
        sent = [send(snd, i) for i in range(CAPACITY)]
        pump(slow, fast, producer)
        assert len(bodies(rcv_fast)) == CAPACITY, round_
        pump(slow, fast, producer)
        assert all(d.remote_state == d.ACCEPTED for d in sent)
    assert bodies(rcv_slow) == []
    slow.conn.resume_writing()
    send_all(snd, 0, settled=False)
    pump(slow, fast, producer)
    got_slow, got_fast = bodies(rcv_slow), bodies(rcv_fast)
    assert got_slow and got_fast  # both take deliveries again
    assert sorted(got_slow + got_fast) == list(range(CAPACITY))
    assert snd.credit > 0


def test_paused_multicast_consumer_stalls_the_address(core) -> None:  # type: ignore[no-untyped-def]
    """Multicast: every copy goes to every consumer; a router without queues can only slow
    the producer to the pace of the slowest one (presettled copies are never dropped)."""
    slow, fast = Peer(core, container="slow"), Peer(core, container="fast")
    rcv_slow = slow.receiver("mc.t", credit=1000)
    rcv_fast = fast.receiver("mc.t", credit=1000)
    producer = Peer(core)
    snd = producer.sender("mc.t")
    pump(slow, fast, producer)
    slow.conn.pause_writing()
    n = send_all(snd, 0)
    pump(slow, fast, producer)
    assert snd.credit == 0
    assert bodies(rcv_fast) == list(range(n))  # the copies it has credit for
    assert bodies(rcv_slow) == []
    slow.conn.resume_writing()
    pump(slow, fast, producer)
    assert bodies(rcv_slow) == list(range(n))
    assert snd.credit > 0


def test_resume_after_the_connection_closed_is_harmless(core) -> None:  # type: ignore[no-untyped-def]
    consumer = Peer(core)
    consumer.receiver("bp.c", credit=10)
    producer = Peer(core)
    snd = producer.sender("bp.c")
    pump(consumer, producer)
    consumer.conn.pause_writing()
    sent = [send(snd, i) for i in range(5)]
    pump(consumer, producer)
    consumer.conn.connection_lost()
    consumer.conn.resume_writing()
    pump(producer)
    assert [d.remote_state for d in sent] == [sent[0].RELEASED] * 5


def test_anonymous_relay_producer_is_held_to_its_credit(core) -> None:  # type: ignore[no-untyped-def]
    """ANONYMOUS-RELAY: no address decides a null-target link's credit, so its deliveries
    waiting in the router count against it: while they fill half of link_capacity it gets no
    more, so it cannot make the router hold more than link_capacity of them."""
    consumer = Peer(core)
    rcv = consumer.receiver("bp.anon", credit=1_000_000)
    producer = Peer(core)
    snd = producer.sender(None)
    pump(consumer, producer)
    assert snd.credit == CAPACITY
    consumer.conn.pause_writing()
    total = 0
    for _ in range(5):  # five times what its credit allows, if it were topped up
        while snd.credit > 0:
            send(snd, total, settled=True, address="bp.anon")
            total += 1
        pump(consumer, producer)
    assert snd.credit == 0
    assert total == core.engine.address("bp.anon").undelivered_count == CAPACITY
    consumer.conn.resume_writing()
    pump(consumer, producer)
    assert bodies(rcv) == list(range(total))
    assert snd.credit == CAPACITY  # nothing waits any more


def test_anonymous_relay_to_a_stalled_multicast_consumer(core) -> None:  # type: ignore[no-untyped-def]
    """The same when the copies wait on a paused multicast consumer's link: each copy queued
    for it counts against the anonymous producer."""
    slow, fast = Peer(core, container="slow"), Peer(core, container="fast")
    rcv_slow = slow.receiver("mc.anon", credit=1000)
    rcv_fast = fast.receiver("mc.anon", credit=1000)
    producer = Peer(core)
    snd = producer.sender(None)
    pump(slow, fast, producer)
    slow.conn.pause_writing()
    total = 0
    for _ in range(5):
        while snd.credit > 0:
            send(snd, total, settled=True, address="mc.anon")
            total += 1
        pump(slow, fast, producer)
    assert snd.credit == 0 and total == CAPACITY
    assert bodies(rcv_fast) == list(range(total))
    slow.conn.resume_writing()
    pump(slow, fast, producer)
    assert bodies(rcv_slow) == list(range(total))
    assert snd.credit == CAPACITY
