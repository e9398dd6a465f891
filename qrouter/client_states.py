"""Delivery states (AMQP 1.0 part 3.4) for the client API: the `Outcome` a sender sees, and
conversions between the encoded states the engine carries, the Described values of an
ATTACH's unsettled map, and state names. Also the client's exceptions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from qrouter._fast.codec import Described, ULong, decode, encode

RECEIVED = 0x23
ACCEPTED = 0x24
REJECTED = 0x25
RELEASED = 0x26
MODIFIED = 0x27
TERMINAL = (ACCEPTED, REJECTED, RELEASED, MODIFIED)
NAMES = {ACCEPTED: "accepted", REJECTED: "rejected", RELEASED: "released", MODIFIED: "modified"}


class ClientError(Exception):
    """Base of the client's errors."""


class ConnectError(ClientError):
    """No URL could be connected (within the configured attempts / time)."""


class LinkDetached(ClientError):
    """The router detached (or refused) a link; `condition` / `description` say why."""

    def __init__(self, condition: str | None, description: str | None = None) -> None:
        super().__init__(f"{condition or 'detached'}: {description or ''}".rstrip(": "))
        self.condition = condition
        self.description = description


class ClientClosed(ClientError):
    """The client (or the link) was closed before the operation completed."""


@dataclass(frozen=True)
class Outcome:
    """The terminal state of a sent delivery (3.4.2 - 3.4.5)."""

    state: str  # "accepted" | "rejected" | "released" | "modified"
    condition: str | None = None  # rejected: the error's condition
    description: str | None = None  # rejected: the error's description
    delivery_failed: bool = False  # modified
    undeliverable_here: bool = False  # modified
    resumed: bool = False  # the outcome came from the router's unsettled map on re-attach

    @property
    def accepted(self) -> bool:
        return self.state == "accepted"


def state_code(state: Any) -> int:
    """The descriptor code of a Described state (0 for None / unknown)."""
    if isinstance(state, Described):
        try:
            return int(state.descriptor)
        except (TypeError, ValueError):
            return {
                "amqp:received:list": RECEIVED,
                "amqp:accepted:list": ACCEPTED,
                "amqp:rejected:list": REJECTED,
                "amqp:released:list": RELEASED,
                "amqp:modified:list": MODIFIED,
            }.get(str(state.descriptor), 0)
    return 0


def state_from_bytes(raw: bytes | None) -> Described | None:
    if not raw:
        return None
    value, _ = decode(raw)
    return value if isinstance(value, Described) else None


def state_to_bytes(state: Described | None) -> bytes | None:
    return None if state is None else encode(state)


def make_state(code: int, detail: Any = None) -> Described:
    """A Described state as the engine's Delivery.update would encode it."""
    if code == REJECTED:
        return Described(ULong(REJECTED), [detail] if detail is not None else [])
    if code == MODIFIED:
        failed, undeliverable = detail if detail is not None else (True, False)
        return Described(ULong(MODIFIED), [bool(failed), bool(undeliverable)])
    return Described(ULong(code), [])


def outcome_of(state: Described | None, resumed: bool = False) -> Outcome | None:
    """The Outcome of a terminal state; None for a non-terminal or missing one."""
    code = state_code(state)
    if code not in TERMINAL:
        return None
    assert state is not None
    fields = state.value if isinstance(state.value, list) else []
    if code == REJECTED:
        cond = desc = None
        err = fields[0] if fields else None
        if isinstance(err, Described) and isinstance(err.value, list) and err.value:
            cond = str(err.value[0]) if err.value[0] is not None else None
            if len(err.value) > 1 and err.value[1] is not None:
                desc = str(err.value[1])
        return Outcome("rejected", cond, desc, resumed=resumed)
    if code == MODIFIED:
        failed = bool(fields[0]) if fields else False
        undeliverable = bool(fields[1]) if len(fields) > 1 else False
        return Outcome("modified", None, None, failed, undeliverable, resumed=resumed)
    return Outcome(NAMES[code], resumed=resumed)
