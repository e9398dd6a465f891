"""Guaranteed-topic control messages from a broken or hostile router (issue 13, point 1):
whatever a map from the wire holds (any AMQP value the codec decodes, in any field), the
topic's state machine drops the message with a log line; no exception leaves `receive`."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.eo import EXACTLY_ONCE
from router.eo.messages import EO_VERSION, FIELDS
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
