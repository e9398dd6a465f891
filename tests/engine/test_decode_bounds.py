"""Bounded decoding (issue 13, point 1): whatever a peer sends, the codec's cost is linear in
the bytes and its recursion is bounded (MAX_DEPTH levels of described / list / map / array,
1.5 and 1.6.22-1.6.24); every violation is a DecodeError (amqp:decode-error, 2.8.15)."""

from __future__ import annotations

import pytest
from proton import Delivery
from qrouter._fast.codec import MAX_DEPTH, DecodeError, decode, decode_all, encode
from qrouter._fast.engine import _test_add_ingress, _test_message_ingress

from qrouter.config import ListenerConfig
from tests.engine.pump import (
    SASL_FRAME,
    SASL_HEADER,
    Peer,
    RawPeer,
    assert_engine_usable,
    attach_frame,
    flow_frame,
    frame,
    make_core,
    message_bytes,
    pump,
    receive,
    send,
)

HUGE = 10**5


def _wrap(core: bytes, levels: int, header) -> bytes:  # type: ignore[no-untyped-def]
    """`core` inside `levels` containers; header(inner_size) is one level's header (built
    outward, joined once: linear, so a million levels take a moment)."""
    heads = []
    size = len(core)
    for _ in range(levels):
        h = header(size)
        heads.append(h)
        size += len(h)
    heads.reverse()
    return b"".join(heads) + core


def _list32(inner: int) -> bytes:
    return b"\xd0" + (inner + 4).to_bytes(4, "big") + b"\x00\x00\x00\x01"


def _map32(inner: int) -> bytes:  # {null: inner}
    return b"\xd1" + (inner + 5).to_bytes(4, "big") + b"\x00\x00\x00\x02\x40"


def _deep(kind: str, levels: int) -> bytes:
    """`levels` nested values of one kind, built directly as bytes (the encoder would recurse
    as deep as the value)."""
    if kind == "described-value":  # a described whose value is described, whose ...
        return b"\x00\x53\x75" * levels + b"\x40"
    if kind == "described-descriptor":  # a descriptor that is itself described ...
        return b"\x00" * levels + b"\x40" + b"\x40" * levels
    if kind == "list":
        return _wrap(b"\x40", levels, _list32)
    if kind == "map":
        return _wrap(b"\x40", levels, _map32)
    if kind == "array":
        # the innermost: the body of an array32 of one null (its constructor is the level
        # above's last byte)
        inner = (5).to_bytes(4, "big") + b"\x00\x00\x00\x01\x40"
        return b"\xf0" + _wrap(
            inner, levels, lambda n: (n + 5).to_bytes(4, "big") + b"\x00\x00\x00\x01\xf0"
        )
    raise AssertionError(kind)


KINDS = ["described-value", "described-descriptor", "list", "map", "array"]


@pytest.mark.parametrize("kind", KINDS)
def test_nesting_of_a_hundred_thousand_levels_is_a_decode_error(kind: str) -> None:
    """The crash of issue 13: 200,000 nested described types killed the router (SIGSEGV)."""
    data = _deep(kind, HUGE)
    with pytest.raises(DecodeError, match="nesting deeper than"):
        decode(data)
    with pytest.raises(DecodeError, match="nesting deeper than"):
        decode_all(data)


def test_nesting_up_to_the_limit_decodes() -> None:
    value: object = None
    for _ in range(MAX_DEPTH):
        value = [value]
    assert decode(encode(value))[0] == value
    with pytest.raises(DecodeError, match="nesting deeper than"):
        decode(encode([value]))


def test_zero_width_array_claiming_four_billion_items() -> None:
    """An array32 of nulls is 10 bytes whatever its count: a count of 2^32 - 1 must not
    become 2^32 Python objects."""
    with pytest.raises(DecodeError, match="zero-width"):
        decode(b"\xf0\x00\x00\x00\x05\xff\xff\xff\xff\x40")
    with pytest.raises(DecodeError, match="zero-width"):
        decode(b"\xe0\x02\xff\x45")  # array8 of 255 list0
    assert decode(b"\xf0\x00\x00\x00\x05\x00\x00\x00\x03\x40")[0].items == [None] * 3


# --- the engine: where a bad value lands decides who hears of it ------------------------------

DEEP = 200_000  # the size of the crash


@pytest.fixture
def core():  # type: ignore[no-untyped-def]
    return make_core()


def _list8(count: int, items: bytes) -> bytes:
    return b"\xc0" + bytes([len(items) + 1, count]) + items


# REJECTED (3.4.3) with an error whose description is not UTF-8: its sizes are right, so
# r_skip passes it, but it does not decode
BAD_STATE = b"\x00\x53\x25" + _list8(1, b"\x00\x53\x1d" + _list8(2, b"\xa3\x01x\xa1\x01\xff"))


def _deep_annotations() -> bytes:
    """A message-annotations section (3.2.3) whose one value nests DEEP described types."""
    value = _deep("described-value", DEEP)
    inner = b"\xa3\x05x-opt" + value  # one key: value
    return b"\x00\x53\x72\xd1" + (len(inner) + 4).to_bytes(4, "big") + b"\x00\x00\x00\x02" + inner


def _deep_message_id_to(to: str) -> bytes:
    """A properties section (3.2.4) whose message-id nests DEEP described types, then `to`."""
    fields = _deep("described-value", DEEP) + b"\x40\xa1" + bytes([len(to)]) + to.encode()
    head = b"\x00\x53\x73\xd0" + (len(fields) + 4).to_bytes(4, "big") + b"\x00\x00\x00\x03"
    return head + fields + b"\x00\x53\x77\xa1\x01x"  # amqp-value "x"


def test_anonymous_relay_rejects_an_undecodable_message(core) -> None:  # type: ignore[no-untyped-def]
    """ANONYMOUS-RELAY reads each message's `to` (3.2.4), skipping what comes before it: a
    message-id nested past the limit REJECTs that delivery with amqp:decode-error (3.4.3);
    the link, its connection and the next message go on."""
    consumer = Peer(core)
    rcv = consumer.receiver("relay-dest", credit=5)
    producer = Peer(core)
    snd = producer.sender(None, "anon")
    pump(consumer, producer)
    bad = snd.delivery(b"bad")
    snd.send(_deep_message_id_to("relay-dest"))
    snd.advance()
    ok = send(snd, "routed", address="relay-dest")
    pump(consumer, producer)
    assert bad.remote_state == Delivery.REJECTED
    assert bad.remote.condition.name == "amqp:decode-error"
    assert "nesting deeper than" in bad.remote.condition.description
    ((cd, m),) = receive(rcv)
    assert m.body == "routed"
    cd.update(Delivery.ACCEPTED)
    cd.settle()
    pump(consumer, producer)
    assert ok.remote_state == Delivery.ACCEPTED
    assert not producer.conn.closed and not consumer.conn.closed
    assert core.engine.n_decode_errors == 1


def test_multicast_ingress_annotation_of_an_undecodable_message() -> None:
    """Multicast toward another router rewrites the message-annotations (annotations.pxi):
    nested past the limit, that is a DecodeError, which the engine turns into REJECTED."""
    with pytest.raises(DecodeError, match="nesting deeper than"):
        _test_add_ingress(_deep_annotations() + message_bytes("x"), "R1")
    assert _test_message_ingress(_deep_annotations()) is None


def test_anycast_forwards_a_message_it_need_not_read(core) -> None:  # type: ignore[no-untyped-def]
    """The router reads no section of a message to a named address (DESIGN.md 2): nested
    annotations travel end to end, as bytes, and the consumer decides."""
    consumer = Peer(core)
    rcv = consumer.receiver("plain", credit=5, max_message_size=1 << 21)
    producer = Peer(core)
    snd = producer.sender("plain")
    pump(consumer, producer)
    payload = _deep_annotations() + message_bytes("x")
    d = snd.delivery(b"t")
    snd.send(payload)
    snd.advance()
    pump(consumer, producer)
    got = rcv.current
    assert got is not None and not got.partial
    assert bytes(rcv.recv(got.pending)) == payload
    assert d.remote_state == 0 and not producer.conn.closed


def test_nesting_in_a_performative_closes_with_decode_error(core) -> None:  # type: ignore[no-untyped-def]
    """2.8.15: an ATTACH whose properties nest past the limit is a decode error on the
    connection; the router goes on."""
    raw = RawPeer(core, ListenerConfig(max_frame_size=1 << 20), max_frame_size=1 << 20)
    props = b"\xd1" + (len(_deep("list", DEEP // 10)) + 5).to_bytes(4, "big")
    props += b"\x00\x00\x00\x02\x40" + _deep("list", DEEP // 10)
    # ATTACH [name, handle, role, null x 10, properties] as bytes: a list32 of 14 fields
    fields = b"\xa1\x01l\x43\x41" + b"\x40" * 10 + props
    body = b"\x00\x53\x12\xd0" + (len(fields) + 4).to_bytes(4, "big") + b"\x00\x00\x00\x0e"
    raw.feed(frame(body + fields))
    assert raw.close_error()[0] == "amqp:decode-error"
    assert "nesting" in raw.close_error()[1]
    assert raw.conn.closed
    assert_engine_usable(core)


@pytest.mark.parametrize("where", ["state", "transfer-state"])
def test_a_state_the_router_relays_must_decode_in_full(core, where: str) -> None:  # type: ignore[no-untyped-def]
    """A delivery state (3.4) the router keeps or relays to the producer as bytes: one that
    r_skip passes (sizes fit) but that does not decode (here invalid UTF-8 in the error's
    description) closes the sender's connection with amqp:decode-error, instead of reaching
    the producer, whose own decoder would close *its* connection."""
    producer = Peer(core, container="producer")
    snd = producer.sender("relay-state")
    consumer = RawPeer(core)
    consumer.feed(attach_frame("c", 0, sender=False, address="relay-state"))
    consumer.feed(flow_frame(handle=0, delivery_count=0, link_credit=5))
    pump(producer)
    if where == "state":
        d = send(snd, "m")
        pump(producer)
        consumer.collect()
        # DISPOSITION role=receiver, first=0, settled, state
        # DISPOSITION [role=receiver, first=0, last=null, settled, state]
        consumer.feed(frame(b"\x00\x53\x15" + _list8(5, b"\x41\x43\x40\x41" + BAD_STATE)))
    else:
        consumer.feed(attach_frame("p", 1, sender=True, address="elsewhere"))
        # TRANSFER [handle=1, id=0, tag "t", format 0, settled false, more false, rsm null,
        # state]
        fields = b"\x52\x01\x43\xa0\x01t\x43\x42\x42\x40" + BAD_STATE
        consumer.feed(frame(b"\x00\x53\x14" + _list8(8, fields), payload=message_bytes("x")))
        d = None
    assert consumer.close_error()[0] == "amqp:decode-error"
    pump(producer)
    assert not producer.conn.closed
    if d is not None:
        # not the bogus REJECTED: the copy went with the consumer, so MODIFIED (3.4.5)
        assert d.remote_state == Delivery.MODIFIED


def test_nesting_in_a_sasl_frame_closes_the_connection(core) -> None:  # type: ignore[no-untyped-def]
    """5.3: a SASL-INIT whose hostname nests past the limit. SASL has no error frame of its
    own for this, so the connection is closed (no AMQP CLOSE: the AMQP layer never began),
    counted as a decode error; the router goes on."""
    raw = RawPeer(core, handshake=False)
    raw.feed(SASL_HEADER)
    assert [f.name for f in raw.frames] == ["sasl-mechanisms"]
    fields = b"\xa3\x09ANONYMOUS\x40" + _deep("described-value", 10_000)
    body = b"\x00\x53\x41\xd0" + (len(fields) + 4).to_bytes(4, "big") + b"\x00\x00\x00\x03"
    raw.feed(frame(body + fields, ftype=SASL_FRAME))
    assert raw.conn.closed
    assert raw.conn.error[0] == "amqp:decode-error" and "nesting" in raw.conn.error[1]
    assert [f.name for f in raw.frames] == ["sasl-mechanisms"]  # no outcome, no AMQP CLOSE
    assert core.engine.n_decode_errors == 1
    assert_engine_usable(core)


def test_anonymous_relay_refuses_a_to_that_is_not_a_string(core) -> None:  # type: ignore[no-untyped-def]
    """3.2.4: `to` is an address-string; a list there is a decode error of that message."""
    producer = Peer(core)
    snd = producer.sender(None, "anon")
    pump(producer)
    d = snd.delivery(b"list-to")
    snd.send(b"\x00\x53\x73\xc0\x04\x03\x40\x40\x45\x00\x53\x77\xa1\x01x")
    snd.advance()
    pump(producer)
    assert d.remote_state == Delivery.REJECTED
    assert d.remote.condition.name == "amqp:decode-error"
    assert "not a string" in d.remote.condition.description
    assert not producer.conn.closed
