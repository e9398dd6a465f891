"""Routing on one router, in memory: proxied credit, outcomes of consumers that go away,
multicast's strongest outcome, dynamic sources and the anonymous relay (DESIGN.md section 4;
AMQP 1.0 2.6.7 credit, 2.6.12 settlement, 3.4 outcomes, 3.5.3 dynamic, ANONYMOUS-RELAY)."""

from __future__ import annotations

from typing import Any

import pytest
from proton import Delivery, Link

from qrouter.config import AddressConfig
from tests.engine.pump import Peer, make_core, pump, receive, send


@pytest.fixture
def core():  # type: ignore[no-untyped-def]
    return make_core(
        addresses=[
            AddressConfig(prefix="mc", distribution="multicast"),
            AddressConfig(prefix="closed", distribution="unavailable"),
        ]
    )


def test_no_credit_without_a_consumer(core) -> None:  # type: ignore[no-untyped-def]
    """2.6.7 / DESIGN 4: a producer of an address with no consumer gets no credit; it gets
    some as soon as a consumer grants credit; it loses it when the consumer goes."""
    producer = Peer(core)
    snd = producer.sender("lonely")
    pump(producer)
    assert snd.credit == 0
    consumer = Peer(core)
    rcv = consumer.receiver("lonely")
    pump(consumer, producer)
    assert snd.credit == 0  # attached, but no credit granted yet
    rcv.flow(3)
    pump(consumer, producer)
    assert snd.credit > 0
    rcv.close()
    pump(consumer, producer)
    assert snd.credit == 0


def test_consumer_detaches_with_deliveries_in_flight(core) -> None:  # type: ignore[no-untyped-def]
    """2.6.12 / 3.4: a consumer that detaches holding deliveries: those it was sent come back
    MODIFIED (delivery-failed: it may have seen them), those never sent come back RELEASED."""
    consumer = Peer(core)
    rcv = consumer.receiver("inflight", credit=2)
    producer = Peer(core)
    snd = producer.sender("inflight")
    pump(consumer, producer)
    sent = [send(snd, i) for i in range(5)]
    pump(consumer, producer)
    assert len(receive(rcv)) == 2  # two were sent to it, three wait in the router
    rcv.close()
    pump(consumer, producer)
    states = [d.remote_state for d in sent]
    assert states[:2] == [Delivery.MODIFIED, Delivery.MODIFIED]
    assert all(d.remote.failed for d in sent[:2])
    assert states[2:] == [Delivery.RELEASED] * 3
    assert all(d.settled for d in sent)


def test_consumer_connection_lost(core) -> None:  # type: ignore[no-untyped-def]
    """The socket of a consumer dies: its unsettled deliveries come back MODIFIED."""
    consumer = Peer(core)
    rcv = consumer.receiver("lost", credit=3)
    producer = Peer(core)
    snd = producer.sender("lost")
    pump(consumer, producer)
    sent = [send(snd, i) for i in range(3)]
    pump(consumer, producer)
    assert len(receive(rcv)) == 3
    consumer.conn.connection_lost()
    pump(producer)
    assert [d.remote_state for d in sent] == [Delivery.MODIFIED] * 3


def test_waiting_delivery_moves_to_another_consumer(core) -> None:  # type: ignore[no-untyped-def]
    """Anycast: a delivery queued for a consumer that leaves before it was sent goes to
    another consumer instead of back to the producer."""
    c1 = Peer(core, container="c1")
    r1 = c1.receiver("moving", credit=1)
    c2 = Peer(core, container="c2")
    r2 = c2.receiver("moving")
    producer = Peer(core)
    snd = producer.sender("moving")
    pump(c1, c2, producer)
    sent = [send(snd, i) for i in range(2)]
    pump(c1, c2, producer)
    assert len(receive(r1)) == 1
    r2.flow(5)
    pump(c1, c2, producer)
    got = receive(r2)
    assert [m.body for _, m in got] == [1]
    for d, _ in got:
        d.update(Delivery.ACCEPTED)
        d.settle()
    pump(c1, c2, producer)
    assert sent[1].remote_state == Delivery.ACCEPTED


def _multicast(core, n: int, credit: int = 5) -> tuple[list[Peer], list[Any], Peer, Any]:  # type: ignore[no-untyped-def]
    consumers = [Peer(core, container=f"c{i}") for i in range(n)]
    receivers = [c.receiver("mc.topic", f"r{i}", credit=credit) for i, c in enumerate(consumers)]
    producer = Peer(core, container="p")
    snd = producer.sender("mc.topic")
    pump(*consumers, producer)
    return consumers, receivers, producer, snd


@pytest.mark.parametrize(
    "outcomes,expected",
    [
        ((Delivery.ACCEPTED, Delivery.RELEASED, Delivery.MODIFIED), Delivery.ACCEPTED),
        ((Delivery.RELEASED, Delivery.REJECTED, Delivery.ACCEPTED), Delivery.REJECTED),
        ((Delivery.RELEASED, Delivery.MODIFIED, Delivery.RELEASED), Delivery.MODIFIED),
        ((Delivery.RELEASED, Delivery.RELEASED, Delivery.RELEASED), Delivery.RELEASED),
    ],
)
def test_multicast_strongest_outcome(core, outcomes: tuple[Any, ...], expected: Any) -> None:  # type: ignore[no-untyped-def]
    """DESIGN 4: one copy per consumer; the producer gets the strongest terminal outcome
    (REJECTED > ACCEPTED > MODIFIED > RELEASED), once every copy is terminal."""
    consumers, receivers, producer, snd = _multicast(core, 3)
    d = send(snd, "fanout")
    pump(*consumers, producer)
    copies = [receive(r) for r in receivers]
    assert all(len(c) == 1 and c[0][1].body == "fanout" for c in copies)
    for i, ((cd, _),) in enumerate(copies):
        cd.update(outcomes[i])
        cd.settle()
        pump(*consumers, producer)
        if i < 2:
            assert d.remote_state == 0  # not all copies terminal yet
    assert d.remote_state == expected


def test_presettled_multicast_goes_out_presettled(core) -> None:  # type: ignore[no-untyped-def]
    consumers, receivers, producer, snd = _multicast(core, 2)
    send(snd, "p", settled=True)
    pump(*consumers, producer)
    for r in receivers:
        ((cd, m),) = receive(r)
        assert m.body == "p" and cd.settled


def test_dynamic_source_gets_a_unique_address(core) -> None:  # type: ignore[no-untyped-def]
    """3.5.3 dynamic: the router names the node; two dynamic receivers get different
    addresses; a message sent to that address reaches only its receiver (reply-to)."""
    a = Peer(core, container="a")
    ra = a.receiver(None, "dyn-a", credit=5, dynamic=True)
    rb = a.receiver(None, "dyn-b", credit=5, dynamic=True)
    pump(a)
    addr_a, addr_b = ra.remote_source.address, rb.remote_source.address
    assert addr_a and addr_b and addr_a != addr_b
    assert ra.remote_source.dynamic
    server = Peer(core, container="server")
    snd = server.sender(addr_a)
    pump(a, server)
    send(snd, "reply")
    pump(a, server)
    assert [m.body for _, m in receive(ra)] == ["reply"]
    assert receive(rb) == []


def test_anonymous_relay(core) -> None:  # type: ignore[no-untyped-def]
    """ANONYMOUS-RELAY: a sender with a null target; each message goes to its `to`; an
    unroutable `to` (no consumer) and an unavailable address come back REJECTED with a
    condition; a message with no `to` is REJECTED too."""
    consumer = Peer(core)
    rcv = consumer.receiver("relay-dest", credit=5)
    producer = Peer(core)
    snd = producer.sender(None, "anon")
    pump(consumer, producer)
    assert snd.remote_target.address is None
    assert snd.credit > 0
    ok = send(snd, "routed", address="relay-dest")
    nowhere = send(snd, "lost", address="no-such-place")
    closed = send(snd, "refused", address="closed.x")
    no_to = send(snd, "no to")
    pump(consumer, producer)
    ((cd, m),) = receive(rcv)
    assert m.body == "routed" and m.address == "relay-dest"
    cd.update(Delivery.ACCEPTED)
    cd.settle()
    pump(consumer, producer)
    assert ok.remote_state == Delivery.ACCEPTED
    for d in (nowhere, closed, no_to):
        assert d.remote_state == Delivery.REJECTED
        assert d.remote.condition is not None and d.remote.condition.name.startswith("amqp:")
    assert "no-such-place" in nowhere.remote.condition.description
    assert producer.conn.links()[0].state == 1  # still attached


def test_unavailable_address_refused_at_attach(core) -> None:  # type: ignore[no-untyped-def]
    producer = Peer(core)
    snd = producer.sender("closed.y")
    pump(producer)
    assert snd.remote_condition.name == "amqp:not-found"


def test_presettled_is_throttled_not_dropped(core) -> None:  # type: ignore[no-untyped-def]
    """Issue 2: presettled traffic is throttled by credit, never silently dropped: a slow
    consumer with credit 10 gets all of 500 presettled messages, 10 at a time."""
    consumer = Peer(core)
    rcv = consumer.receiver("slow", credit=10)
    producer = Peer(core)
    snd = producer.sender("slow", snd_settle_mode=Link.SND_SETTLED)
    pump(consumer, producer)
    got: list[int] = []
    sent = 0
    for _ in range(2000):
        while snd.credit > 0 and sent < 500:
            send(snd, sent, settled=True)
            sent += 1
        pump(consumer, producer)
        batch = receive(rcv)
        got += [m.body for _, m in batch]
        if batch:
            rcv.flow(len(batch))
        if len(got) == 500:
            break
    assert got == list(range(500))
    assert core.engine.address("slow").n_dropped == 0


def test_exactly_once_end_to_end_over_many(core) -> None:  # type: ignore[no-untyped-def]
    """2.8.3 second: 50 deliveries, each accepted, settled by the producer, then by the
    consumer; nothing stays unsettled anywhere."""
    consumer = Peer(core)
    rcv = consumer.receiver("eo-many", credit=50, rcv_settle_mode=Link.RCV_SECOND)
    producer = Peer(core)
    snd = producer.sender("eo-many", target_durable=2, rcv_settle_mode=Link.RCV_SECOND)
    pump(consumer, producer)
    sent = [send(snd, i) for i in range(50)]
    pump(consumer, producer)
    got = receive(rcv)
    for d, _ in got:
        d.update(Delivery.ACCEPTED)
    pump(consumer, producer)
    for d in sent:
        assert d.remote_state == Delivery.ACCEPTED and not d.settled
        d.settle()
    pump(consumer, producer)
    for d, _ in got:
        assert d.settled
        d.settle()
    pump(consumer, producer)
    assert producer.conn.links()[0].unsettled_count == 0
    assert consumer.conn.links()[0].unsettled_count == 0
