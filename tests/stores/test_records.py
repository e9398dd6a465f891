"""The record encodings (qrouter/stores/values.py, qrouter/stores/termini.py) without a store: round trips, and
damaged bytes that must give ValueError (so the store layer reports them), never anything else."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qrouter.stores.termini import (
    TerminusKey,
    TerminusRecord,
    UnsettledRecord,
    decode_terminus,
    decode_unsettled,
    encode_terminus,
    encode_unsettled,
)
from qrouter.stores.values import MAX_DEPTH, Value, pack, unpack

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
values = st.recursive(
    scalars | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(values)
def test_values_round_trip(value: Value) -> None:
    assert unpack(pack(value)) == value


@given(st.binary(max_size=64))
def test_values_reject_garbage_with_value_error(data: bytes) -> None:
    try:
        unpack(data)
    except ValueError:
        pass


def test_values_limits() -> None:
    deep: Value = []
    for _ in range(MAX_DEPTH + 2):
        deep = [deep]
    with pytest.raises(ValueError, match="deeper"):
        pack(deep)
    with pytest.raises(ValueError, match="deeper"):
        unpack(b"l\x00\x00\x00\x01" * (MAX_DEPTH + 2) + b"N")
    with pytest.raises(ValueError, match="trailing"):
        unpack(pack(1) + b"N")
    with pytest.raises(ValueError, match="truncated"):
        unpack(b"l\xff\xff\xff\xff")  # a huge count is refused before any allocation
    with pytest.raises(ValueError):
        pack({1: "non-str key"})  # type: ignore[dict-item]


records = st.builds(
    TerminusRecord,
    key=st.builds(
        TerminusKey, st.text(), st.text(), st.text(), st.sampled_from(["sender", "receiver"])
    ),
    address=st.none() | st.text(),
    source=st.none() | st.dictionaries(st.text(), values, max_size=4),
    target=st.none() | st.dictionaries(st.text(), values, max_size=4),
    durability=st.integers(0, 2),
    expiry_policy=st.sampled_from(["link-detach", "session-end", "connection-close", "never"]),
    timeout=st.integers(0, 2**32 - 1) | st.floats(0, 1e6),
    suspended_at=st.none() | st.floats(0, 4e9),
)


@given(records)
def test_terminus_round_trip(rec: TerminusRecord) -> None:
    assert decode_terminus(encode_terminus(rec)) == rec


@given(records, st.integers(0, 200), st.integers(0, 255))
def test_damaged_terminus_is_a_value_error(rec: TerminusRecord, at: int, xor: int) -> None:
    data = bytearray(encode_terminus(rec))
    data[at % len(data)] ^= xor
    for damaged in (bytes(data), bytes(data[: at % len(data)])):
        try:
            decode_terminus(damaged)
        except ValueError:
            pass


@given(st.none() | st.binary(), st.none() | st.binary(), st.booleans())
def test_unsettled_round_trip(state: bytes | None, message: bytes | None, settled: bool) -> None:
    rec = UnsettledRecord(state, message, settled)
    assert decode_unsettled(encode_unsettled(rec)) == rec


@given(
    st.none() | st.binary(),
    st.none() | st.binary(max_size=32),
    st.none() | st.binary(max_size=255),
    st.none() | st.binary(),
)
def test_unsettled_with_tag_and_origin_round_trip(
    state: bytes | None, tag: bytes | None, origin: bytes | None, message: bytes | None
) -> None:
    # the engine writes these (qrouter/_fast/durable.pxi record_value): an inbound delivery's
    # record stored under the router's id carries the producer's tag; a copy names its origin
    rec = UnsettledRecord(state, message, False, origin, tag)
    assert decode_unsettled(encode_unsettled(rec)) == rec


def test_unsettled_tag_longer_than_a_tag_is_refused() -> None:
    data = encode_unsettled(UnsettledRecord(tag=b"x" * 32))
    with pytest.raises(ValueError, match="tag length"):
        decode_unsettled(data[:7] + b"\x21" + b"x" * 33)


@given(st.binary(max_size=32))
def test_damaged_unsettled_is_a_value_error(data: bytes) -> None:
    try:
        decode_unsettled(data)
    except ValueError:
        pass


def test_record_checks() -> None:
    key = TerminusKey("a", "b", "c", "sender")
    for bad in ({"durability": 3}, {"expiry_policy": "sometimes"}, {"timeout": -1}):
        with pytest.raises(ValueError):
            TerminusRecord(key, **bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="32 octets"):
        TerminusRecord(key, unsettled={b"x" * 33: UnsettledRecord()})
    with pytest.raises(ValueError, match="role"):
        TerminusKey("a", "b", "c", "sending")  # type: ignore[arg-type]
    # The digest depends on every field, and field boundaries cannot be shifted.
    assert (
        TerminusKey("ab", "c", "d", "sender").digest != TerminusKey("a", "bc", "d", "sender").digest
    )
