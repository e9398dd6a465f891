"""x-opt-qr-ingress: the multicast ingress annotation (qrouter/_fast/annotations.pxi)."""

from __future__ import annotations

from qrouter._fast.codec import Symbol
from qrouter._fast.engine import _test_add_ingress, _test_message_ingress

from qrouter.message import Message, decode_message, encode_message

KEY = Symbol("x-opt-qr-ingress")


def test_added_as_a_new_section_after_header() -> None:
    raw = encode_message(Message(body="x", durable=True, subject="s"))
    assert _test_message_ingress(raw) is None
    out = _test_add_ingress(raw, "R1")
    m = decode_message(out)
    assert m.message_annotations == {KEY: "R1"}
    assert (m.body, m.durable, m.subject) == ("x", True, "s")
    assert _test_message_ingress(out) == "R1"


def test_merged_into_existing_annotations() -> None:
    raw = encode_message(
        Message(
            body=b"\x00" * 100, message_annotations={"x-opt-a": 7}, delivery_annotations={"d": 1}
        )
    )
    out = _test_add_ingress(raw, "B")
    m = decode_message(out)
    assert m.message_annotations == {Symbol("x-opt-a"): 7, KEY: "B"}
    assert m.delivery_annotations == {Symbol("d"): 1}
    assert m.body == b"\x00" * 100
    # a second router does not add a second key
    assert decode_message(_test_add_ingress(out, "C")).message_annotations[KEY] == "C"


def test_garbage_has_no_ingress() -> None:
    assert _test_message_ingress(b"\x00\x53\x72\xc1") is None
    assert _test_message_ingress(b"") is None
