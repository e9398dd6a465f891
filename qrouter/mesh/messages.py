"""Control messages of the mesh protocol (docs/mesh.md, "Messages").

On the wire every message is a plain dict of str / int / list / dict, so the data plane can
encode it as an AMQP map (AMQP 1.0 §1.6.23) with no schema of its own. Inside the engine the
dicts are decoded once into the frozen dataclasses below; a malformed message raises
`ProtocolError` at the edge instead of a KeyError deep in the routing code.

Every message carries ``op`` and ``v`` (`PROTOCOL_VERSION`). A router ignores messages of
another version (and logs it): a mixed-version mesh then partitions cleanly instead of routing
on misread state. Unknown extra keys are ignored, so a later minor revision may add fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

PROTOCOL_VERSION = 1

Wire = dict[str, Any]


class ProtocolError(ValueError):
    """A control message that cannot be understood (bad op, version or field)."""


@dataclass(frozen=True, slots=True)
class Hello:
    """Neighbour discovery on one inter-router connection; never forwarded."""

    OP: ClassVar[str] = "HELLO"
    id: str
    instance: int  # process start time: a restarted router has a larger one
    seen: tuple[str, ...] = ()  # ids heard on this connection within hello_max_age

    def to_wire(self) -> Wire:
        return _head(self.OP) | {"id": self.id, "instance": self.instance, "seen": list(self.seen)}


@dataclass(frozen=True, slots=True)
class RouterAdvert:
    """Periodic summary of a router's state, flooded; ra_seq makes each one unique."""

    OP: ClassVar[str] = "RA"
    id: str
    instance: int
    ra_seq: int
    ls_seq: int
    mobile_seq: int

    def to_wire(self) -> Wire:
        return _head(self.OP) | {
            "id": self.id,
            "instance": self.instance,
            "ra_seq": self.ra_seq,
            "ls_seq": self.ls_seq,
            "mobile_seq": self.mobile_seq,
        }


@dataclass(frozen=True, slots=True)
class LinkStateUpdate:
    """One router's link state (neighbour -> cost), flooded when it changes."""

    OP: ClassVar[str] = "LSU"
    id: str
    instance: int
    ls_seq: int
    ls: Mapping[str, int] = field(default_factory=dict)

    def to_wire(self) -> Wire:
        return _head(self.OP) | {
            "id": self.id,
            "instance": self.instance,
            "ls_seq": self.ls_seq,
            "ls": dict(self.ls),
        }


@dataclass(frozen=True, slots=True)
class LinkStateRequest:
    """Ask a neighbour for its copy of `target`'s link state (answered with an LSU)."""

    OP: ClassVar[str] = "LSR"
    id: str  # the requester
    target: str

    def to_wire(self) -> Wire:
        return _head(self.OP) | {"id": self.id, "target": self.target}


@dataclass(frozen=True, slots=True)
class MobileUpdate:
    """Mobile addresses of router `id`: a delta (add/del) or, with `exist`, the full list.

    A delta applies only to the state at ``mobile_seq - 1``; a full list replaces any older
    state. Both are flooded.
    """

    OP: ClassVar[str] = "MAU"
    id: str
    instance: int
    mobile_seq: int
    add: tuple[str, ...] = ()
    delete: tuple[str, ...] = ()  # "del" on the wire (a Python keyword)
    exist: tuple[str, ...] | None = None

    def to_wire(self) -> Wire:
        wire = _head(self.OP) | {
            "id": self.id,
            "instance": self.instance,
            "mobile_seq": self.mobile_seq,
        }
        if self.exist is not None:
            wire["exist"] = list(self.exist)
        else:
            wire["add"] = list(self.add)
            wire["del"] = list(self.delete)
        return wire


@dataclass(frozen=True, slots=True)
class MobileRequest:
    """Ask a neighbour for the full address list of `target` (answered with a full MAU)."""

    OP: ClassVar[str] = "MAR"
    id: str
    target: str

    def to_wire(self) -> Wire:
        return _head(self.OP) | {"id": self.id, "target": self.target}


Message = Hello | RouterAdvert | LinkStateUpdate | LinkStateRequest | MobileUpdate | MobileRequest


def decode(wire: Mapping[str, Any]) -> Message:
    """Check and convert one received map; raise `ProtocolError` if it is not a valid message."""
    if not isinstance(wire, Mapping):
        raise ProtocolError(f"control message is not a map: {type(wire).__name__}")
    version = _int(wire, "v")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {version}, this router speaks {PROTOCOL_VERSION}")
    op = wire.get("op")
    if op == Hello.OP:
        return Hello(_str(wire, "id"), _int(wire, "instance"), _strs(wire, "seen"))
    if op == RouterAdvert.OP:
        return RouterAdvert(
            _str(wire, "id"),
            _int(wire, "instance"),
            _int(wire, "ra_seq"),
            _int(wire, "ls_seq"),
            _int(wire, "mobile_seq"),
        )
    if op == LinkStateUpdate.OP:
        return LinkStateUpdate(
            _str(wire, "id"), _int(wire, "instance"), _int(wire, "ls_seq"), _costs(wire, "ls")
        )
    if op == LinkStateRequest.OP:
        return LinkStateRequest(_str(wire, "id"), _str(wire, "target"))
    if op == MobileUpdate.OP:
        exist = _strs(wire, "exist") if "exist" in wire else None
        return MobileUpdate(
            _str(wire, "id"),
            _int(wire, "instance"),
            _int(wire, "mobile_seq"),
            add=_strs(wire, "add") if exist is None else (),
            delete=_strs(wire, "del") if exist is None else (),
            exist=exist,
        )
    if op == MobileRequest.OP:
        return MobileRequest(_str(wire, "id"), _str(wire, "target"))
    raise ProtocolError(f"unknown op {op!r}")


def _head(op: str) -> Wire:
    return {"op": op, "v": PROTOCOL_VERSION}


def _str(wire: Mapping[str, Any], key: str) -> str:
    value = wire.get(key)
    if not isinstance(value, str) or not value:
        raise ProtocolError(f"{key!r} must be a non-empty string")
    return value


def _int(wire: Mapping[str, Any], key: str) -> int:
    value = wire.get(key)
    # bool is an int subclass; a True where a sequence number belongs is a sender bug.
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ProtocolError(f"{key!r} must be a non-negative integer")
    return value


def _strs(wire: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = wire.get(key, [])
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise ProtocolError(f"{key!r} must be a list of strings")
    return tuple(value)


def _costs(wire: Mapping[str, Any], key: str) -> dict[str, int]:
    value = wire.get(key)
    if not isinstance(value, Mapping):
        raise ProtocolError(f"{key!r} must be a map of router id to cost")
    costs: dict[str, int] = {}
    for peer, cost in value.items():
        # Costs must be positive: Dijkstra (path.py) is only correct for positive weights.
        if not isinstance(peer, str) or not isinstance(cost, int) or isinstance(cost, bool):
            raise ProtocolError(f"{key!r} must be a map of router id to cost")
        if cost < 1:
            raise ProtocolError(f"{key!r}: cost to {peer!r} must be at least 1")
        costs[peer] = cost
    return costs
