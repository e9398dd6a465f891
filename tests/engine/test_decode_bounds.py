"""Bounded decoding (issue 13, point 1): whatever a peer sends, the codec's cost is linear in
the bytes and its recursion is bounded (MAX_DEPTH levels of described / list / map / array,
1.5 and 1.6.22-1.6.24); every violation is a DecodeError (amqp:decode-error, 2.8.15)."""

from __future__ import annotations

import pytest
from router._fast.codec import MAX_DEPTH, DecodeError, decode, decode_all, encode

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
