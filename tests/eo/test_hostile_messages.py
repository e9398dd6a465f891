"""Guaranteed-topic control messages from a broken or hostile router (issue 13, point 1):
whatever a map from the wire holds (any AMQP value the codec decodes, in any field), the
topic's state machine drops the message with a log line; no exception leaves `receive`."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from qrouter._fast.codec import DecodeError

from qrouter.eo import EXACTLY_ONCE
from qrouter.eo.messages import EO_VERSION, FIELDS
from tests.engine.test_codec import values
from tests.eo.test_protocol import Net

# what a field may hold: any decoded value, or the right container of arbitrary values
field_values = st.one_of(
    values,
    st.lists(values, max_size=4),
    st.lists(st.lists(values, max_size=4), max_size=4),
    st.binary(max_size=8),
    st.integers(-(2**70), 2**70),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(FIELDS)), st.data())
def test_any_field_values_are_dropped_not_raised(op: str, data: st.DataObject) -> None:
    net = Net("AB", mode=EXACTLY_ONCE)
    message: dict[str, Any] = {"op": op, "v": EO_VERSION, "topic": net.r["A"].topic}
    for name in FIELDS[op]:
        message[name] = data.draw(field_values, label=name)
    net.r["A"].receive("B", message, 1.0)  # must not raise
    net.pump(1.0)


# the compact encoding of envelopes between routers (qrouter/_fast/eo_wire.pxi)
wire_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(wire_values)
def test_compact_envelope_encoding_round_trips(value: Any) -> None:
    from qrouter._fast.engine import eo_pack, eo_unpack

    raw = eo_pack(value)
    assert eo_unpack(raw) == value
    for cut in range(len(raw)):
        with pytest.raises(DecodeError):
            eo_unpack(raw[:cut])


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=64))
def test_compact_envelope_decoding_of_any_bytes_raises_decode_error_or_returns(raw: bytes) -> None:
    from qrouter._fast.engine import eo_unpack

    try:
        eo_unpack(raw)
    except DecodeError:
        pass


def test_compact_envelope_decoding_is_bounded() -> None:
    from qrouter._fast.engine import eo_pack, eo_unpack

    with pytest.raises(DecodeError):
        eo_unpack(b"\x06\xff\xff\xff\xff")  # a list of 2^32-1 values in 4 bytes: refused
    with pytest.raises(DecodeError):
        eo_unpack(b"\x06\x00\x00\x00\x01" * 40 + b"\x00")  # nested too deep
    for bad in (2**63, 1.5, {1: 2}, object()):
        with pytest.raises(ValueError):
            eo_pack(bad)


def test_compact_envelope_words() -> None:
    from qrouter._fast.engine import EO_WORDS, eo_pack, eo_unpack

    value = {w: [w, w + "x", {w: w}] for w in EO_WORDS}
    assert eo_unpack(eo_pack(value)) == value
    assert eo_pack("FWD") == b"\x08" + bytes([EO_WORDS.index("FWD")])
    with pytest.raises(DecodeError):
        eo_unpack(b"\x08" + bytes([len(EO_WORDS)]))  # no such word
    with pytest.raises(DecodeError):
        eo_unpack(b"\x08")


def test_eo_control_messages_in_both_encodings() -> None:
    from qrouter._fast.engine import eo_pack

    from qrouter.inter_router import eo_envelopes

    envs = [{"to": "B", "from": "A", "e": 1, "n": 0, "m": {"op": "PING", "e": 3}}]
    assert eo_envelopes({"op": "EO", "b": eo_pack(envs)}) == envs
    assert eo_envelopes({"op": "EO", "m": envs}) == envs  # a router before the compact form
    assert eo_envelopes({"op": "EO", "b": b"\x07"}) is None
    assert eo_envelopes({"op": "EO", "b": "text"}) is None
