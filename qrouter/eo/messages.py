"""Messages between routers for a guaranteed topic (docs/exactly-once.md, "Messages").

Plain maps of str / int / bytes / list, so they encode as AMQP maps with no schema, like the
mesh protocol's (qrouter/mesh/messages.py). Every message carries `op`, `v` (protocol version)
and `topic` (the address of the guaranteed topic: one `TopicRouter` per topic). A subscriber
is `[container, link]`, an attachment `[router, instance, n]`, a map entry `[tag, accepted]`.

Optional fields (a router of an older version omits them; each has a safe default): SUB and
UNSUB `at`, the attachment's stamp (view.py: the order of attachments); SUBS `stamps`, a list
of `[attachment, stamp]` for the attachments it names, and `closed_at`.

They travel on one FIFO channel per pair of routers (an AMQP link from router to router): the
protocol relies on that order, and on a channel that breaks losing what was in flight (both
ends are then told `router_down`, and re-synchronise on `router_up`).
"""

from __future__ import annotations

from typing import Any

from qrouter._fast.eo_core import FIELDS, ProtocolError, att_of, sub_of
from qrouter._fast.eo_core import PROTOCOL_VERSION as EO_VERSION
from qrouter.eo.records import AttId

__all__ = ["EO_VERSION", "FIELDS", "ProtocolError", "att_of", "sub_of"]

Wire = dict[str, Any]

# the schema and its error are defined beside the compiled check (FIELDS: op -> {field:
# type}; every field is required, extra keys are ignored)


def make(op: str, topic: str, **fields: Any) -> Wire:
    return {"op": op, "v": EO_VERSION, "topic": topic, **fields}


def check(msg: Any) -> Wire:
    """Validate `msg`; raise ProtocolError with the reason."""
    if not isinstance(msg, dict):
        raise ProtocolError("not a map")
    op = msg.get("op")
    if op not in FIELDS:
        raise ProtocolError(f"unknown op {op!r}")
    if msg.get("v") != EO_VERSION:
        raise ProtocolError(f"{op}: version {msg.get('v')!r}, expected {EO_VERSION}")
    for name, kind in FIELDS[op].items():
        value = msg.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ProtocolError(f"{op}: field {name!r} missing or not {kind.__name__}")
    return msg


def att_wire(att: AttId) -> list[Any]:
    return [att[0], att[1], att[2]]


STAMP_MAX = 2**62  # ms since the epoch: far beyond any clock, and a bounded integer


def stamp_of(value: Any) -> int | None:
    """An optional attachment stamp: None when absent (an older router)."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < STAMP_MAX:
        raise ProtocolError(f"bad attachment stamp {value!r}")
    return value


def stamps_of(value: Any, limit: int) -> dict[AttId, int]:
    """SUBS' optional `stamps`: [[attachment, stamp], ...], at most `limit` entries."""
    if value is None:
        return {}
    if not isinstance(value, list) or len(value) > limit:
        raise ProtocolError("bad stamps list")
    out: dict[AttId, int] = {}
    for entry in value:
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], list)):
            raise ProtocolError(f"bad stamp entry {entry!r}")
        stamp = stamp_of(entry[1])
        if stamp is not None:
            out[att_of(entry[0])] = stamp
    return out


def map_wire(unsettled: dict[bytes, bool]) -> list[list[Any]]:
    return [[tag, int(accepted)] for tag, accepted in unsettled.items()]


def map_of(value: Any) -> dict[bytes, bool]:
    out: dict[bytes, bool] = {}
    for tag, accepted in value:
        if not isinstance(tag, bytes):
            raise ProtocolError(f"bad tag {tag!r}")
        out[tag] = bool(accepted)
    return out
