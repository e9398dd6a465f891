"""DISPOSITION (2.7.6) over ranges, the delivery states (3.4), and settlement end to end,
including exactly-once (rcv-settle-mode second, 3.8.3 / 2.8.3), socketless."""

from __future__ import annotations

from typing import Any

import pytest
from proton import Condition, Delivery, Link, symbol

from tests.engine.pump import (
    DISPOSITION,
    RELEASED,
    TRANSFER,
    Peer,
    RawPeer,
    UInt,
    attach_frame,
    described,
    error,
    flow_frame,
    make_core,
    perf,
    pump,
    receive,
    send,
    settle_range,
)


@pytest.fixture
def core():  # type: ignore[no-untyped-def]
    return make_core()


def _pair(core, address: str, credit: int = 20, durable: int = 0, **modes: Any):  # type: ignore[no-untyped-def]
    consumer = Peer(core, container="consumer")
    rcv = consumer.receiver(address, credit=credit, **modes)
    producer = Peer(core, container="producer")
    snd = producer.sender(address, target_durable=durable, **modes)
    pump(consumer, producer)
    return consumer, rcv, producer, snd


def test_accepted_travels_back(core) -> None:  # type: ignore[no-untyped-def]
    """3.4.2 accepted: the consumer's outcome reaches the producer, settled (rcv-settle-mode
    first: the router settles as it reports)."""
    consumer, rcv, producer, snd = _pair(core, "acc")
    d = send(snd, "m")
    pump(consumer, producer)
    assert d.remote_state == 0  # nothing until the consumer decides
    ((cd, _),) = receive(rcv)
    cd.update(Delivery.ACCEPTED)
    cd.settle()
    pump(consumer, producer)
    assert d.remote_state == Delivery.ACCEPTED
    assert d.settled


def test_rejected_with_error(core) -> None:  # type: ignore[no-untyped-def]
    """3.4.3 rejected: the error (condition, description, info) reaches the producer."""
    consumer, rcv, producer, snd = _pair(core, "rej")
    d = send(snd, "bad")
    pump(consumer, producer)
    ((cd, _),) = receive(rcv)
    cd.local.condition = Condition("app:invalid", "no thanks", {symbol("line"): 7})
    cd.update(Delivery.REJECTED)
    cd.settle()
    pump(consumer, producer)
    assert d.remote_state == Delivery.REJECTED
    cond = d.remote.condition
    assert cond.name == "app:invalid" and cond.description == "no thanks"
    assert cond.info == {symbol("line"): 7}


def test_released(core) -> None:  # type: ignore[no-untyped-def]
    """3.4.4 released."""
    consumer, rcv, producer, snd = _pair(core, "rel")
    d = send(snd, "m")
    pump(consumer, producer)
    ((cd, _),) = receive(rcv)
    cd.update(Delivery.RELEASED)
    cd.settle()
    pump(consumer, producer)
    assert d.remote_state == Delivery.RELEASED


@pytest.mark.parametrize("failed,undeliverable", [(True, False), (False, True), (True, True)])
def test_modified_with_flags(core, failed: bool, undeliverable: bool) -> None:  # type: ignore[no-untyped-def]
    """3.4.5 modified: delivery-failed, undeliverable-here and message-annotations reach the
    producer unchanged."""
    consumer, rcv, producer, snd = _pair(core, "mod")
    d = send(snd, "m")
    pump(consumer, producer)
    ((cd, _),) = receive(rcv)
    cd.local.failed = failed
    cd.local.undeliverable = undeliverable
    cd.local.annotations = {symbol("x-why"): "busy"}
    cd.update(Delivery.MODIFIED)
    cd.settle()
    pump(consumer, producer)
    assert d.remote_state == Delivery.MODIFIED
    assert d.remote.failed is failed
    assert d.remote.undeliverable is undeliverable
    assert d.remote.annotations == {symbol("x-why"): "busy"}


def test_received_state_travels(core) -> None:  # type: ignore[no-untyped-def]
    """3.4.1 received (non-terminal): the consumer reports how far it got; the producer
    sees the state (section-number / offset) on its unsettled delivery."""
    consumer, rcv, producer, snd = _pair(core, "recv")
    d = send(snd, "m")
    pump(consumer, producer)
    ((cd, _),) = receive(rcv)
    cd.local.section_number = 2
    cd.local.section_offset = 10
    cd.update(Delivery.RECEIVED)
    pump(consumer, producer)
    assert d.remote_state == Delivery.RECEIVED
    assert (d.remote.section_number, d.remote.section_offset) == (2, 10)
    assert not d.settled
    cd.update(Delivery.ACCEPTED)
    cd.settle()
    pump(consumer, producer)
    assert d.remote_state == Delivery.ACCEPTED


def test_disposition_over_a_range(core) -> None:  # type: ignore[no-untyped-def]
    """2.7.6 first / last: one DISPOSITION settles a range; the router's dispositions to
    the producer are coalesced into ranges too."""
    producer = Peer(core, container="producer")
    consumer = RawPeer(core)
    consumer.feed(attach_frame("c", 0, sender=False, address="range"))
    consumer.feed(flow_frame(handle=0, delivery_count=0, link_credit=20))
    snd = producer.sender("range")
    pump(producer)
    sent = [send(snd, i) for i in range(10)]
    pump(producer)
    consumer.collect()
    assert len(consumer.of(TRANSFER)) == 10
    consumer.feed(settle_range(0, 9))
    pump(producer)
    assert all(d.remote_state == Delivery.ACCEPTED and d.settled for d in sent)
    ranges = [
        (f.fields["first"], f.fields["last"])
        for f in producer.frames_from_router()
        if f.code == DISPOSITION
    ]
    assert ranges == [(0, 9)]


def test_disposition_range_with_gaps_and_unknown_ids(core) -> None:  # type: ignore[no-untyped-def]
    """2.7.6: ids in the range that are not unsettled are ignored; a huge range
    (0 .. 2^32-1) does not make the engine walk four billion ids."""
    producer = Peer(core)
    consumer = RawPeer(core)
    consumer.feed(attach_frame("c", 0, sender=False, address="gaps"))
    consumer.feed(flow_frame(handle=0, delivery_count=0, link_credit=20))
    snd = producer.sender("gaps")
    pump(producer)
    sent = [send(snd, i) for i in range(4)]
    pump(producer)
    consumer.feed(settle_range(1, 1, RELEASED))
    consumer.feed(settle_range(0, 0xFFFFFFFF))
    pump(producer)
    assert [d.remote_state for d in sent] == [
        Delivery.ACCEPTED,
        Delivery.RELEASED,
        Delivery.ACCEPTED,
        Delivery.ACCEPTED,
    ]
    assert consumer.close_error() is None


def test_rejected_state_from_raw_consumer(core) -> None:  # type: ignore[no-untyped-def]
    """3.4.3 with the raw codec: the rejected error is forwarded as it came."""
    producer = Peer(core)
    consumer = RawPeer(core)
    consumer.feed(attach_frame("c", 0, sender=False, address="raw-rej"))
    consumer.feed(flow_frame(handle=0, delivery_count=0, link_credit=5))
    snd = producer.sender("raw-rej")
    pump(producer)
    d = send(snd, "m")
    pump(producer)
    consumer.feed(
        perf(
            DISPOSITION,
            role=True,
            first=UInt(0),
            settled=True,
            state=described(0x25, error=error("amqp:x", "raw reason")),
        )
    )
    pump(producer)
    assert d.remote_state == Delivery.REJECTED
    assert d.remote.condition.name == "amqp:x"


def test_settled_without_state_counts_as_accepted(core) -> None:  # type: ignore[no-untyped-def]
    """3.4: a consumer that settles with no outcome took the message (the router's sources
    offer no default-outcome, so accepted is what reaches the producer)."""
    consumer, rcv, producer, snd = _pair(core, "nostate")
    d = send(snd, "m")
    pump(consumer, producer)
    ((cd, _),) = receive(rcv)
    cd.settle()
    pump(consumer, producer)
    assert d.remote_state == Delivery.ACCEPTED and d.settled


def test_exactly_once(core) -> None:  # type: ignore[no-untyped-def]
    """2.8.3 rcv-settle-mode second / 3.8.3: the consumer's ACCEPTED reaches the producer
    unsettled; the producer settles; only then does the consumer see the settlement."""
    modes = {"rcv_settle_mode": Link.RCV_SECOND}
    # the router grants second to a producer whose target keeps unsettled state
    consumer, rcv, producer, snd = _pair(core, "eo", durable=2, **modes)
    assert snd.remote_rcv_settle_mode == Link.RCV_SECOND
    assert rcv.remote_rcv_settle_mode == Link.RCV_SECOND
    d = send(snd, "once")
    pump(consumer, producer)
    ((cd, m),) = receive(rcv)
    assert m.body == "once"
    cd.update(Delivery.ACCEPTED)  # not settled: second mode
    pump(consumer, producer)
    assert d.remote_state == Delivery.ACCEPTED
    assert not d.settled  # the router waits for the producer
    assert not cd.settled
    d.settle()
    pump(consumer, producer)
    assert cd.settled  # the producer's settlement travelled forward
    cd.settle()
    pump(consumer, producer)
    assert producer.conn.links()[0].unsettled_count == 0
    assert consumer.conn.links()[0].unsettled_count == 0


def test_producer_settles_first(core) -> None:  # type: ignore[no-untyped-def]
    """3.8.1 / 2.6.12: a producer that settles before an outcome (it no longer cares): the
    settlement reaches the consumer."""
    consumer, rcv, producer, snd = _pair(core, "forget")
    d = send(snd, "m")
    pump(consumer, producer)
    ((cd, _),) = receive(rcv)
    d.settle()
    pump(consumer, producer)
    assert cd.settled


def test_disposition_on_presettled_is_ignored(core) -> None:  # type: ignore[no-untyped-def]
    raw = RawPeer(core)
    raw.feed(perf(DISPOSITION, role=True, first=UInt(100), settled=True, state=described(0x24)))
    assert raw.close_error() is None


def test_disposition_without_role_is_a_decode_error(core) -> None:  # type: ignore[no-untyped-def]
    """2.7.6: role and first are mandatory."""
    raw = RawPeer(core)
    raw.feed(perf(DISPOSITION, first=UInt(0)))
    assert raw.close_error()[0] == "amqp:decode-error"
