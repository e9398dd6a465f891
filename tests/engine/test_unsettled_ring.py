"""A session's unsettled deliveries (2.6.12) are held in a ring indexed by delivery-id with
a dict beside it (qrouter/_fast/unsettled.pxi): ids out of sequence, colliding in the ring,
repeated or near 2^32, and more unsettled than the ring first spans, all get the outcomes
and errors a plain map gave, socketless."""

from __future__ import annotations

from proton import Delivery

from tests.engine.pump import (
    DISPOSITION,
    TRANSFER,
    Peer,
    RawPeer,
    assert_engine_usable,
    attach_frame,
    flow_frame,
    make_core,
    message_bytes,
    pump,
    receive,
    send,
    settle_range,
    transfer_frame,
)


def _raw_producer(core, address: str) -> RawPeer:  # type: ignore[no-untyped-def]
    raw = RawPeer(core)
    raw.feed(attach_frame("raw-producer", 0, sender=True, address=address))
    return raw


def _settled_accepted(raw: RawPeer) -> list[int]:
    """The producer's delivery-ids the router's DISPOSITIONs settled as accepted."""
    ids: list[int] = []
    for f in raw.of(DISPOSITION):
        assert f.fields["role"] is True
        if not f.fields["settled"]:
            continue
        first = int(f.fields["first"])
        last = f.fields.get("last")
        last = first if last is None else int(last)
        state = f.fields["state"]
        assert (state["_code"] if isinstance(state, dict) else int(state.descriptor)) == 0x24
        ids += list(range(first, last + 1))
    return ids


# colliding in a ring of 16, 256 or 4096 slots (0, 4096, 2^31), at the top of the range, and
# out of order
IDS = [0, 4096, 0x80000000, 0xFFFFFFFF, 7, 0xFFFFFFF7, 263, 0x80000007, 1, 16, 32]


def test_out_of_sequence_and_colliding_delivery_ids() -> None:
    """2.7.5: delivery-ids are the sender's; whatever their pattern, each one's outcome
    returns under its own id, whatever order the consumer settles in."""
    core = make_core()
    consumer = Peer(core)
    rcv = consumer.receiver("ring-ids", credit=len(IDS))
    pump(consumer)
    raw = _raw_producer(core, "ring-ids")
    pump(consumer)
    for i, did in enumerate(IDS):
        raw.feed(transfer_frame(0, did, b"t%d" % i, message_bytes(i)))
    pump(consumer)
    got = receive(rcv)
    assert sorted(m.body for _, m in got) == list(range(len(IDS)))
    link = raw.conn.links()[0]
    assert link.unsettled_count == len(IDS)
    for d, _ in reversed(got):
        d.update(Delivery.ACCEPTED)
        d.settle()
        pump(consumer)
    raw.collect()
    assert sorted(_settled_accepted(raw)) == sorted(IDS)
    assert link.unsettled_count == 0
    assert raw.close_error() is None
    assert_engine_usable(core)


def test_repeated_delivery_id_as_before() -> None:
    """A peer that reuses an unsettled delivery-id (2.6.12 forbids it) is not closed for it:
    both deliveries travel, the outcome under that id reaches it, and the engine goes on."""
    core = make_core()
    consumer = Peer(core)
    rcv = consumer.receiver("ring-repeat", credit=5)
    pump(consumer)
    raw = _raw_producer(core, "ring-repeat")
    pump(consumer)
    raw.feed(transfer_frame(0, 5, b"a", message_bytes("a")))
    raw.feed(transfer_frame(0, 5, b"b", message_bytes("b")))
    pump(consumer)
    got = receive(rcv)
    assert [m.body for _, m in got] == ["a", "b"]
    for d, _ in got:
        d.update(Delivery.ACCEPTED)
        d.settle()
    pump(consumer)
    raw.collect()
    assert set(_settled_accepted(raw)) == {5}
    assert raw.close_error() is None
    assert_engine_usable(core)


def test_huge_disposition_range_over_a_grown_ring() -> None:
    """A consumer's DISPOSITION over every id (0 .. 2^32-1) settles all 600 unsettled copies
    (more than the ring's first size: it grew), and each outcome reaches its producer."""
    core = make_core()
    producer = Peer(core)
    consumer = RawPeer(core)
    consumer.feed(attach_frame("c", 0, sender=False, address="ring-range"))
    consumer.feed(flow_frame(handle=0, delivery_count=0, link_credit=600))
    snd = producer.sender("ring-range")
    pump(producer)
    sent = []
    while len(sent) < 600:
        assert snd.credit > 0
        sent += [send(snd, i) for i in range(min(snd.credit, 600 - len(sent)))]
        pump(producer)
    consumer.collect()
    assert len(consumer.of(TRANSFER)) == 600
    assert consumer.conn.links()[0].unsettled_count == 600
    consumer.feed(settle_range(0, 0xFFFFFFFF))
    pump(producer)
    assert [d.remote_state for d in sent] == [Delivery.ACCEPTED] * 600
    assert consumer.conn.links()[0].unsettled_count == 0
    assert consumer.close_error() is None


def test_detach_with_many_unsettled_fails_each_once() -> None:
    """2.6.12: a consumer that detaches with 600 unsettled copies (ring and dict both in
    use) leaves each one's producer a MODIFIED(delivery-failed), exactly once each."""
    core = make_core()
    consumer = Peer(core)
    rcv = consumer.receiver("ring-detach", credit=600)
    producer = Peer(core)
    snd = producer.sender("ring-detach")
    pump(consumer, producer)
    sent = []
    while len(sent) < 600:
        assert snd.credit > 0
        sent += [send(snd, i) for i in range(min(snd.credit, 600 - len(sent)))]
        pump(consumer, producer)
    assert len(receive(rcv)) == 600
    rcv.close()
    pump(consumer, producer)
    assert [d.remote_state for d in sent] == [Delivery.MODIFIED] * 600
    assert producer.conn.links()[0].unsettled_count == 0
