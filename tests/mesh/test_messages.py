"""Control messages: plain AMQP-encodable maps, versioned, checked on the way in."""

from __future__ import annotations

import pytest

from qrouter.mesh.messages import (
    PROTOCOL_VERSION,
    Hello,
    LinkStateRequest,
    LinkStateUpdate,
    MobileRequest,
    MobileUpdate,
    ProtocolError,
    RouterAdvert,
    decode,
)
from tests.mesh.network import check_encodable

SAMPLES = [
    Hello("A", 17, ("B",)),
    RouterAdvert("A", 17, 3, 4, 5),
    LinkStateUpdate("A", 17, 4, {"B": 1, "C": 10}),
    LinkStateRequest("B", "A"),
    MobileUpdate("A", 17, 5, add=("q1",), delete=("q0",)),
    MobileUpdate("A", 17, 6, exist=("q1", "q2")),
    MobileRequest("B", "A"),
]


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: m.OP)
def test_round_trip(msg: object) -> None:
    wire = msg.to_wire()  # type: ignore[attr-defined]
    check_encodable(wire)
    assert wire["v"] == PROTOCOL_VERSION
    assert decode(wire) == msg


def test_mobile_update_wire_keys() -> None:
    assert MobileUpdate("A", 1, 2, add=("x",)).to_wire()["del"] == []
    assert "add" not in MobileUpdate("A", 1, 2, exist=()).to_wire()


@pytest.mark.parametrize(
    "wire",
    [
        [],
        {"op": "HELLO", "id": "A", "instance": 1},  # no version
        {"op": "HELLO", "v": 2, "id": "A", "instance": 1},  # another protocol version
        {"op": "NOPE", "v": 1},
        {"op": "HELLO", "v": 1, "id": "", "instance": 1},
        {"op": "HELLO", "v": 1, "id": "A", "instance": True},
        {"op": "HELLO", "v": 1, "id": "A", "instance": -1},
        {"op": "HELLO", "v": 1, "id": "A", "instance": 1, "seen": ["B", 3]},
        {"op": "LSU", "v": 1, "id": "A", "instance": 1, "ls_seq": 2, "ls": {"B": 0}},
        {"op": "LSU", "v": 1, "id": "A", "instance": 1, "ls_seq": 2, "ls": ["B"]},
        {"op": "MAU", "v": 1, "id": "A", "instance": 1, "mobile_seq": 2, "add": "q"},
    ],
)
def test_malformed_refused(wire: object) -> None:
    with pytest.raises(ProtocolError):
        decode(wire)  # type: ignore[arg-type]


def test_unknown_keys_ignored() -> None:
    wire = Hello("A", 1).to_wire() | {"later": "field"}
    assert decode(wire) == Hello("A", 1)
