"""qrouter.message against python-qpid-proton's Message.encode()/decode(), both ways
(AMQP 1.0 part 3.2)."""

from __future__ import annotations

import uuid

import pytest
from qrouter._fast.codec import DecodeError, Symbol

from qrouter.message import Message, decode_message, encode_message

proton = pytest.importorskip("proton", reason="the reference peer is python-qpid-proton")


def _proton(data: bytes) -> proton.Message:
    m = proton.Message()
    m.decode(data)
    return m


def test_ours_to_proton_all_properties() -> None:
    cid = uuid.uuid4()
    m = Message(
        body="hello",
        durable=True,
        priority=7,
        ttl=1.5,
        first_acquirer=True,
        delivery_count=3,
        message_id=42,
        user_id=b"alice",
        to="orders/eu",
        subject="new-order",
        reply_to="replies/1",
        correlation_id=cid,
        content_type="text/plain",
        content_encoding="utf-8",
        absolute_expiry_time=1700000100.5,
        creation_time=1700000000.25,
        group_id="g1",
        group_sequence=9,
        reply_to_group_id="rg",
        application_properties={"k": 1, "s": "v", "f": 2.5, "b": True},
        message_annotations={"x-opt-a": "b"},
        delivery_annotations={"x-opt-d": 5},
    )
    p = _proton(encode_message(m))
    assert p.body == "hello"
    assert p.durable is True
    assert p.priority == 7
    assert p.ttl == 1.5
    assert p.first_acquirer is True
    assert p.delivery_count == 3
    assert p.id == 42
    assert p.user_id == b"alice"
    assert p.address == "orders/eu"
    assert p.subject == "new-order"
    assert p.reply_to == "replies/1"
    assert p.correlation_id == cid
    assert p.content_type == "text/plain"
    assert p.content_encoding == "utf-8"
    assert p.expiry_time == 1700000100.5
    assert p.creation_time == 1700000000.25
    assert p.group_id == "g1"
    assert p.group_sequence == 9
    assert p.reply_to_group_id == "rg"
    assert p.properties == {"k": 1, "s": "v", "f": 2.5, "b": True}
    assert p.annotations == {proton.symbol("x-opt-a"): "b"}
    assert p.instructions == {proton.symbol("x-opt-d"): 5}


@pytest.mark.parametrize(
    "body",
    [b"\x00binary\xff", "text", 12345, None, [1, "two", 3.0], {"a": [1, 2], "b": {"c": None}}],
)
def test_bodies_ours_to_proton(body: object) -> None:
    p = _proton(encode_message(Message(body=body)))
    got = bytes(p.body) if isinstance(p.body, memoryview) else p.body
    assert got == body


def test_bytes_body_is_a_data_section() -> None:
    # 3.2.6: bytes go in a data section (0x75), which proton reports as an inferred body
    data = encode_message(Message(body=b"abc"))
    assert data == b"\x00\x53\x75\xa0\x03abc"
    assert _proton(data).inferred is True


def test_sequence_body() -> None:
    data = encode_message(Message(body=[1, 2], body_type="sequence"))
    p = _proton(data)
    assert p.inferred is True and list(p.body) == [1, 2]
    back = decode_message(data)
    assert back.body_type == "sequence" and back.body == [1, 2]


def test_proton_to_ours_all_properties() -> None:
    cid = uuid.uuid4()
    p = proton.Message(
        body={"k": [1, 2]},
        durable=True,
        priority=2,
        ttl=3.25,
        first_acquirer=True,
        delivery_count=4,
        id="msg-1",
        user_id=b"bob",
        address="a/b",
        subject="s",
        reply_to="r",
        correlation_id=cid,
        content_type="application/json",
        content_encoding="gzip",
        expiry_time=1700000200.0,
        creation_time=1700000000.5,
        group_id="g",
        group_sequence=7,
        reply_to_group_id="rg",
        properties={"p": "q", "n": 10},
        annotations={proton.symbol("x-opt-m"): "v"},
        instructions={proton.symbol("x-opt-i"): 1},
    )
    m = decode_message(p.encode())
    assert m.body == {"k": [1, 2]} and m.body_type == "value"
    assert (m.durable, m.priority, m.ttl, m.first_acquirer, m.delivery_count) == (
        True,
        2,
        3.25,
        True,
        4,
    )
    assert m.message_id == "msg-1"
    assert m.user_id == b"bob"
    assert (m.to, m.subject, m.reply_to) == ("a/b", "s", "r")
    assert m.correlation_id == cid
    assert (m.content_type, m.content_encoding) == ("application/json", "gzip")
    assert m.absolute_expiry_time == 1700000200.0
    assert m.creation_time == 1700000000.5
    assert (m.group_id, m.group_sequence, m.reply_to_group_id) == ("g", 7, "rg")
    assert m.application_properties == {"p": "q", "n": 10}
    assert m.message_annotations == {Symbol("x-opt-m"): "v"}
    assert m.delivery_annotations == {Symbol("x-opt-i"): 1}


@pytest.mark.parametrize("body", [b"bin", "str", 7, [1, 2], {"x": 1.5}, None])
def test_bodies_proton_to_ours(body: object) -> None:
    m = decode_message(proton.Message(body=body).encode())
    assert m.body == body


def test_proton_inferred_data_and_ulong_id() -> None:
    p = proton.Message(body=b"raw", id=99)
    p.inferred = True
    m = decode_message(p.encode())
    assert m.body == b"raw" and m.body_type == "data"
    assert m.message_id == 99


def test_round_trip_ours() -> None:
    m = Message(body=b"x", to="t", application_properties={"a": 1}, ttl=2.0, message_id=b"id")
    back = decode_message(encode_message(m))
    assert (back.body, back.to, back.application_properties, back.ttl, back.message_id) == (
        b"x",
        "t",
        {"a": 1},
        2.0,
        b"id",
    )


def test_not_a_message() -> None:
    with pytest.raises(DecodeError):
        decode_message(b"\x45")  # an empty list is not a section
    with pytest.raises(DecodeError):
        decode_message(b"\x00\x53\x99\x45")  # an unknown section
