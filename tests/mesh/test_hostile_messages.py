"""Mesh control messages from a broken or hostile router (issue 13, point 1): any AMQP
value the codec decodes, in any field of any op, is a `ProtocolError` (the routing engine
drops the message with a log line) or a valid message; nothing else is raised."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qrouter.mesh.messages import PROTOCOL_VERSION, ProtocolError, decode
from tests.engine.test_codec import values

OPS = ["HELLO", "RA", "LSU", "LSR", "MAU", "MAR", "NOPE"]
KEYS = ["id", "instance", "seen", "ra_seq", "ls_seq", "mobile_seq", "ls", "target", "add",
        "del", "exist"]  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(OPS),
    st.dictionaries(st.sampled_from(KEYS), st.one_of(values, st.lists(values, max_size=3))),
    st.one_of(st.just(PROTOCOL_VERSION), values),
)
def test_any_decoded_values_are_refused_or_valid(op: str, fields: dict[str, Any], v: Any) -> None:
    wire = {"op": op, "v": v, **fields}
    try:
        decode(wire)
    except ProtocolError:
        pass


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values)
def test_any_top_level_value(value: Any) -> None:
    try:
        decode(value)
    except ProtocolError:
        pass
