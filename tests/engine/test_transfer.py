"""TRANSFER (2.7.5): multi-frame deliveries (2.6.14), aborted, settled, resume, batchable,
message-format, and the limits (max-frame-size 2.7.1, max-message-size 2.7.3), socketless."""

from __future__ import annotations

import pytest
from proton import Delivery, Link

from qrouter.config import ListenerConfig
from qrouter.limits import LimitsConfig
from tests.engine.pump import (
    AMQP_HEADER,
    DISPOSITION,
    FLOW,
    TRANSFER,
    Peer,
    RawPeer,
    UInt,
    attach_frame,
    begin_frame,
    described,
    flow_frame,
    frame,
    make_core,
    message_bytes,
    open_frame,
    pump,
    receive,
    send,
    transfer_frame,
)


@pytest.fixture
def core():  # type: ignore[no-untyped-def]
    return make_core()


def _pair(core, address: str, credit: int = 10, **kw):  # type: ignore[no-untyped-def]
    consumer = Peer(core, container="consumer", **kw)
    rcv = consumer.receiver(address, credit=credit)
    producer = Peer(core, container="producer", **kw)
    snd = producer.sender(address)
    pump(consumer, producer)
    return consumer, rcv, producer, snd


def _raw_producer(core, address: str, **kw) -> RawPeer:  # type: ignore[no-untyped-def]
    raw = RawPeer(core, **kw)
    raw.feed(attach_frame("raw-producer", 0, sender=True, address=address))
    return raw


def test_multi_frame_both_directions() -> None:
    """2.6.14 / 2.7.5 more: with 512-byte frames on both sides a 10 kB message travels as
    many frames (more=true on all but the last), into and out of the router."""
    core = make_core()
    listener = ListenerConfig(max_frame_size=512)
    consumer, rcv, producer, snd = _pair(core, "big", listener=listener, max_frame_size=512)
    body = bytes(range(256)) * 40
    d = send(snd, body)
    pump(consumer, producer)
    got = receive(rcv)
    assert [m.body for _, m in got] == [body]
    inbound = [f for f in _frames(producer.to_router) if f.code == TRANSFER]
    outbound = [f for f in consumer.frames_from_router() if f.code == TRANSFER]
    for frames in (inbound, outbound):
        assert len(frames) > 15
        assert all(f.fields["more"] for f in frames[:-1]) and not frames[-1].fields["more"]
        # 2.7.5: delivery-id and tag on the first frame (later ones may omit them)
        assert frames[0].fields["delivery_tag"] is not None
    assert max(_sizes(consumer.from_router)) <= 512
    assert max(_sizes(producer.to_router)) <= 512
    got[0][0].update(Delivery.ACCEPTED)
    got[0][0].settle()
    pump(consumer, producer)
    assert d.remote_state == Delivery.ACCEPTED


def _sizes(data: bytes | bytearray) -> list[int]:
    from tests.engine.test_connection import _frame_sizes

    return _frame_sizes(bytes(data))


def _frames(data: bytes | bytearray):  # type: ignore[no-untyped-def]
    from tests.engine.pump import parse_output

    return parse_output(bytes(data))[1]


def test_aborted_delivery_is_discarded(core) -> None:  # type: ignore[no-untyped-def]
    """2.6.14 / 2.7.5 aborted: a partly sent delivery that is aborted is discarded; the
    next delivery on the link is unaffected."""
    listener = ListenerConfig(max_frame_size=512)
    consumer, rcv, producer, snd = _pair(core, "abort-q", listener=listener, max_frame_size=512)
    d = snd.delivery(b"aborted")
    snd.send(message_bytes("x" * 2000)[:1500])  # part of a message, no advance()
    pump(consumer, producer)
    d.abort()
    pump(consumer, producer)
    assert rcv.current is None or not rcv.current.readable or rcv.current.aborted
    send(snd, "after")
    pump(consumer, producer)
    got = receive(rcv)
    assert [m.body for _, m in got] == ["after"]
    assert producer.transport.condition is None and not producer.conn.closed


def test_raw_aborted_transfer(core) -> None:  # type: ignore[no-untyped-def]
    """2.7.5 aborted with the raw codec: more=true, then an aborted frame; then a new one."""
    consumer = Peer(core)
    rcv = consumer.receiver("abort-raw", credit=5)
    pump(consumer)
    raw = _raw_producer(core, "abort-raw")
    pump(consumer)
    raw.collect()
    payload = message_bytes("whole")
    raw.feed(transfer_frame(0, 0, b"a", payload[:5], more=True))
    raw.feed(transfer_frame(0, None, None, b"", aborted=True))
    raw.feed(transfer_frame(0, 1, b"b", payload))
    pump(consumer)
    assert [m.body for _, m in receive(rcv)] == ["whole"]
    assert raw.close_error() is None
    # an aborted first frame (nothing before it) is simply nothing
    raw.feed(transfer_frame(0, 2, b"c", payload, aborted=True))
    pump(consumer)
    assert receive(rcv) == []


def test_presettled_transfer(core) -> None:  # type: ignore[no-untyped-def]
    """2.7.5 settled / 2.8.2 snd-settle-mode settled: a presettled delivery arrives settled
    at the consumer, and nothing comes back to the producer."""
    consumer = Peer(core)
    rcv = consumer.receiver("presettled", credit=5)
    producer = Peer(core)
    snd = producer.sender("presettled", snd_settle_mode=Link.SND_SETTLED)
    pump(consumer, producer)
    send(snd, "fire-and-forget", settled=True)
    pump(consumer, producer)
    ((d, m),) = receive(rcv)
    assert m.body == "fire-and-forget"
    assert d.settled  # settled by the remote (the router)
    outbound = [f for f in consumer.frames_from_router() if f.code == TRANSFER]
    assert outbound[-1].fields["settled"] is True
    assert not [f for f in producer.frames_from_router() if f.code == DISPOSITION]


def test_settled_on_a_later_frame(core) -> None:  # type: ignore[no-untyped-def]
    """2.7.5 settled: "may be set on any frame of a multi-frame delivery"."""
    consumer = Peer(core)
    rcv = consumer.receiver("late-settle", credit=5)
    pump(consumer)
    raw = _raw_producer(core, "late-settle")
    pump(consumer)
    payload = message_bytes("late")
    raw.feed(transfer_frame(0, 0, b"a", payload[:4], more=True))
    raw.feed(transfer_frame(0, None, None, payload[4:], settled=True))
    pump(consumer)
    ((d, m),) = receive(rcv)
    assert m.body == "late"
    raw.collect()
    assert not raw.of(DISPOSITION)  # nothing to tell a producer that settled
    assert raw.conn.links()[0].unsettled_count == 0


def test_resume_and_batchable_are_accepted(core) -> None:  # type: ignore[no-untyped-def]
    """2.7.5 resume / batchable: a delivery flagged resume (2.6.13, not known to the
    router, so delivered as new) and batchable transfers are routed normally."""
    consumer = Peer(core)
    rcv = consumer.receiver("flags", credit=5)
    pump(consumer)
    raw = _raw_producer(core, "flags")
    pump(consumer)
    raw.feed(
        transfer_frame(
            0,
            0,
            b"r",
            message_bytes("resumed"),
            resume=True,
            state=described(0x23, section_number=UInt(0), section_offset=None),
        )
    )
    raw.feed(transfer_frame(0, 1, b"b", message_bytes("batched"), batchable=True))
    pump(consumer)
    assert [m.body for _, m in receive(rcv)] == ["resumed", "batched"]
    assert raw.close_error() is None


def test_message_format_travels(core) -> None:  # type: ignore[no-untyped-def]
    """2.7.5 message-format: forwarded unchanged with the delivery."""
    consumer = RawPeer(core)
    consumer.feed(attach_frame("c", 0, sender=False, address="fmt"))
    consumer.feed(flow_frame(handle=0, delivery_count=0, link_credit=5))
    raw = _raw_producer(core, "fmt")
    raw.feed(transfer_frame(0, 0, b"f", message_bytes("m"), message_format=UInt(0x01020304)))
    consumer.collect()
    (t,) = consumer.of(TRANSFER)
    assert t.fields["message_format"] == 0x01020304


def test_frame_over_max_frame_size(core) -> None:  # type: ignore[no-untyped-def]
    """2.7.1 / 2.8.16: a frame larger than our max-frame-size: amqp:connection:framing-error.
    Other connections carry on."""
    consumer, rcv, producer, snd = _pair(core, "mfs-ok")
    raw = _raw_producer(core, "mfs-ok", listener=ListenerConfig(max_frame_size=512))
    raw.feed(transfer_frame(0, 0, b"t", message_bytes("x" * 600)))
    assert raw.close_error()[0] == "amqp:connection:framing-error"
    assert raw.conn.closed
    send(snd, "still flowing")
    pump(consumer, producer)
    assert [m.body for _, m in receive(rcv)] == ["still flowing"]


def test_frame_size_checked_before_the_frame_arrives(core) -> None:  # type: ignore[no-untyped-def]
    """2.3.1: the size field alone is enough to refuse (no buffering of a huge frame)."""
    raw = RawPeer(core, ListenerConfig(max_frame_size=512))
    raw.feed((1 << 30).to_bytes(4, "big") + b"\x02\x00\x00\x00")
    assert raw.close_error()[0] == "amqp:connection:framing-error"


def test_transfer_on_unknown_handle(core) -> None:  # type: ignore[no-untyped-def]
    """2.8.17 unattached-handle: a TRANSFER on a handle with no link."""
    raw = RawPeer(core)
    raw.feed(transfer_frame(5, 0, b"t", message_bytes("x")))
    errs = [f.error()[0] for f in raw.frames if f.name in ("end", "close") and f.error()]
    assert errs == ["amqp:session:unattached-handle"]


def test_transfer_on_a_consumer_link(core) -> None:  # type: ignore[no-untyped-def]
    """2.6.1: a TRANSFER travels sender to receiver; on a link where the peer receives it
    is a protocol error."""
    raw = RawPeer(core)
    raw.feed(attach_frame("c", 0, sender=False, address="wrong-way"))
    raw.feed(transfer_frame(0, 0, b"t", message_bytes("x")))
    assert raw.conn.closed and raw.close_error() is not None


def test_transfer_without_credit(core) -> None:  # type: ignore[no-untyped-def]
    """2.6.7: a sender MUST NOT send without credit; the link is detached with
    amqp:link:transfer-limit-exceeded; the connection stays up."""
    raw = _raw_producer(core, "no-consumer")
    raw.feed(transfer_frame(0, 0, b"t", message_bytes("x")))
    (detach,) = [f for f in raw.frames if f.name == "detach"]
    assert detach.error()[0] == "amqp:link:transfer-limit-exceeded"
    assert not raw.conn.closed


def test_first_transfer_needs_id_and_tag(core) -> None:  # type: ignore[no-untyped-def]
    """2.7.5: delivery-id and delivery-tag are required on the first frame of a delivery."""
    consumer = Peer(core)
    consumer.receiver("needs-tag", credit=5)
    pump(consumer)
    raw = _raw_producer(core, "needs-tag")
    raw.feed(transfer_frame(0, None, None, message_bytes("x")))
    assert raw.close_error() is not None


def test_tag_longer_than_32_bytes(core) -> None:  # type: ignore[no-untyped-def]
    """2.8.7: delivery-tag is binary of at most 32 octets."""
    consumer = Peer(core)
    consumer.receiver("long-tag", credit=5)
    pump(consumer)
    raw = _raw_producer(core, "long-tag")
    raw.feed(transfer_frame(0, 0, b"t" * 33, message_bytes("x")))
    assert raw.close_error() is not None


@pytest.mark.parametrize("frame_size", [None, 512])
def test_message_over_max_message_size(frame_size: int | None) -> None:
    """2.7.3 max-message-size / 2.8.18 amqp:link:message-size-exceeded: the link is
    detached, the connection and its other links stay open (single- and multi-frame), with
    limits.message_size_exceeded = "detach"."""
    core = make_core(max_message_size=1000, limits=LimitsConfig(message_size_exceeded="detach"))
    listener = ListenerConfig(max_frame_size=frame_size or 65536)
    consumer, rcv, producer, snd = _pair(
        core, "limit", listener=listener, max_frame_size=frame_size
    )
    other = producer.sender("limit", "other-sender")
    pump(consumer, producer)
    send(snd, "x" * 2000)
    pump(consumer, producer)
    assert snd.remote_condition.name == "amqp:link:message-size-exceeded"
    assert not producer.conn.closed
    assert producer.connection.remote_condition is None
    assert receive(rcv) == []
    send(other, "small")
    pump(consumer, producer)
    assert [m.body for _, m in receive(rcv)] == ["small"]


@pytest.mark.parametrize("frame_size", [None, 512])
def test_message_over_max_message_size_closes_the_connection(frame_size: int | None) -> None:
    """By default (limits.message_size_exceeded = "close") the link is detached with
    amqp:link:message-size-exceeded and then the connection is closed with
    amqp:connection:forced: nothing more of the message is read. Another connection goes on."""
    core = make_core(max_message_size=1000)
    listener = ListenerConfig(max_frame_size=frame_size or 65536)
    consumer, rcv, producer, snd = _pair(
        core, "limit", listener=listener, max_frame_size=frame_size
    )
    send(snd, "x" * 2000)
    pump(consumer, producer)
    assert snd.remote_condition.name == "amqp:link:message-size-exceeded"
    assert producer.conn.closed
    assert producer.connection.remote_condition.name == "amqp:connection:forced"
    assert "message exceeds 1000 bytes" in producer.connection.remote_condition.description
    assert core.limits.engine.counters()["message_size"] == 1
    assert receive(rcv) == []
    again = Peer(core, container="again", listener=listener, max_frame_size=frame_size)
    send(again.sender("limit", "again"), "small")
    pump(consumer, again)
    assert [m.body for _, m in receive(rcv)] == ["small"]


def test_huge_multi_frame_message_via_small_frames() -> None:
    """A 1 MiB message through 16 KiB frames, intact (issue 2 acceptance, in memory)."""
    core = make_core()
    listener = ListenerConfig(max_frame_size=16384)
    consumer, rcv, producer, snd = _pair(core, "mib", listener=listener, max_frame_size=16384)
    body = bytes(i % 251 for i in range(1 << 20))
    send(snd, body)
    pump(consumer, producer)
    ((d, m),) = receive(rcv)
    assert m.body == body


def test_transfer_before_begin_is_refused(core) -> None:  # type: ignore[no-untyped-def]
    raw = RawPeer(core, handshake=False)
    raw.feed(AMQP_HEADER + open_frame())
    raw.feed(transfer_frame(0, 0, b"t", b"x", channel=0))
    assert raw.close_error()[0] == "amqp:connection:framing-error"


def test_transfer_in_flight_after_flow_revoked(core) -> None:  # type: ignore[no-untyped-def]
    """2.6.7 / 3.4.4: a consumer vanishes while the producer still holds credit: the
    router takes the credit back, and a transfer already on the wire comes back RELEASED."""
    consumer = Peer(core)
    rcv = consumer.receiver("revoke", credit=3)
    producer = Peer(core)
    snd = producer.sender("revoke")
    pump(consumer, producer)
    assert snd.credit > 0
    rcv.close()
    pump(consumer)  # the producer has not heard about it yet
    d = send(snd, "late")
    pump(consumer, producer)
    assert d.remote_state == Delivery.RELEASED
    assert snd.remote_condition is None  # the link survives: that transfer was legitimate
    assert snd.credit <= 0  # proton: delivery-count 0 + credit 0 - 1 sent
    flows = [f for f in producer.frames_from_router() if f.code == FLOW]
    assert flows[-1].fields["link_credit"] == 0


def test_frame_with_extended_header(core) -> None:  # type: ignore[no-untyped-def]
    """2.3.1: doff > 2 means an extended header, which is ignored."""
    consumer = Peer(core)
    rcv = consumer.receiver("ext", credit=1)
    pump(consumer)
    raw = _raw_producer(core, "ext")
    body = transfer_frame(0, 0, b"e", message_bytes("ext"))[8:]
    ext = (8 + 4 + len(body)).to_bytes(4, "big") + bytes([3, 0, 0, 0]) + b"XXXX" + body
    raw.feed(ext)
    pump(consumer)
    assert [m.body for _, m in receive(rcv)] == ["ext"]
    assert frame(None) == b"\x00\x00\x00\x08\x02\x00\x00\x00"
    assert begin_frame()  # helper sanity


def test_transfers_past_credit_within_a_links_overshoot(core) -> None:  # type: ignore[no-untyped-def]
    """A broker's in-autolink (qrouter/brokers.py sets `overshoot`; RabbitMQ 3.10 sends what
    its queue had handed over after a FLOW lowered the credit): transfers past the credit are
    taken, at most `overshoot` of them after each FLOW of the router; the next is still
    amqp:link:transfer-limit-exceeded (2.6.7)."""
    raw = _raw_producer(core, "no-consumer-overshoot")
    (link,) = raw.conn.links()
    assert link.overshoot == 0  # a client's link: no slack (test_transfer_without_credit)
    link.overshoot = 2
    for i in range(2):
        raw.feed(transfer_frame(0, i, b"t%d" % i, message_bytes("x"), settled=True))
    assert not [f for f in raw.frames if f.name == "detach"]
    raw.feed(transfer_frame(0, 2, b"t2", message_bytes("x"), settled=True))
    (detach,) = [f for f in raw.frames if f.name == "detach"]
    assert detach.error()[0] == "amqp:link:transfer-limit-exceeded"
