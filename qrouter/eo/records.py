"""Delivery records of a guaranteed topic (the seed's "delivery records kept for topic").

Two kinds, because a router plays two roles for one delivery:

* `OriginRecord` — at the router that holds (or held) the publisher's link: the message, the
  publisher's identity and original tag, the outgoing tag, and the state of *every* subscriber
  the delivery is owed to. The seed tracks "other interested routers"; we track their
  subscribers (`interested_routers` derives the per-router view), because a subscriber can move
  from one router to another while the delivery is in flight and the obligation moves with it.
  Durable: written to the `RecordStore` before anything that depends on it leaves the router.
* `LocalRecord` — at a router with subscribers: the message (None while it is a *placeholder*,
  a delivery a resumed subscriber reported that this router has not received yet), the
  router to accept to, and the state of each local subscriber attachment. Memory only: after a
  crash the subscribers' own unsettled maps are the truth (docs/exactly-once.md, "What is
  durable").
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from enum import IntEnum

Sub = tuple[str, str]
"""A subscriber: (container-id, link name) of its receiving link."""
Pub = tuple[str, str]
"""A publisher: (container-id, link name) of its sending link."""
AttId = tuple[str, int, int]
"""One attachment of a subscriber link: (router id, router instance, counter)."""


class LocalState(IntEnum):
    """One local subscriber attachment's state for one delivery."""

    HELD = 0  # placeholder: reported unsettled (not accepted) on attach, message not here yet
    QUEUED = 1  # to be delivered, in the attachment's order
    DELIVERED = 2  # transfer sent, no outcome yet (in doubt)
    ACCEPTED = 3  # the subscriber accepted
    SETTLING = 4  # we settled it to the subscriber; waiting for its settle in return
    SEEN = 5  # the subscriber settled too (or never had it): nothing more to do


# The records are compiled (qrouter/_fast/eo_core.pyx), with the fields, constructor and
# durable encoding the dataclasses here had:
#
# OriginRecord(out_tag, publisher, tag, body, subs, settled=False): body None when recovered
#   from a store that lacked it (never sent empty); subs: Sub -> SubState; settled: the
#   publisher settled (or forgot) the delivery. Not persisted, what has been sent in the
#   current connection incarnations: accepted_sent, forwarded / filled / settle_sent (sets of
#   AttId). Methods pending(), done(), interested_routers(where), encode_state() (STATE_V2),
#   OriginRecord.decode(out_tag, state, body) (STATE_V2, or the JSON of older releases).
# LocalRecord(out_tag, body=None, publisher=None, tag=None, drivers=set(), subs={},
#   settled=False, settled_epoch=0, settled_by=set()): body None for a placeholder or a
#   settled tombstone; drivers: routers that forwarded it (where ACCEPT goes); subs:
#   AttId -> LocalState; settled_epoch: the barrier epoch when the settlement arrived;
#   settled_by: routers that want SEEN. `placeholder`, all_accepted(), all_seen().
# Inside, neither keeps a dict or set per record (docs/exactly-once.md, "What it costs"):
# `subs`, `forwarded`, `drivers`, ... read as new dicts and sets, so they change by assigning
# them or with OriginRecord.add_sub / pop_sub / has_sub, LocalRecord.set_sub / pop_sub / has_sub.
#
# STATE_V2, the origin record state, version 2: 0x02, settled (1 byte), publisher container
# and link, the original tag, the subscriber count (u32), then per subscriber (in sorted
# order) its container, link and state (1 byte). Strings are UTF-8 and every variable field
# has a u32 big-endian length prefix. Version 1 (JSON, first byte ``{``) is still read.
from qrouter._fast.eo_core import STATE_V2 as STATE_V2  # noqa: E402 (re-exported)
from qrouter._fast.eo_core import LocalRecord as LocalRecord  # noqa: E402 (re-exported)
from qrouter._fast.eo_core import OriginRecord as OriginRecord  # noqa: E402 (re-exported)

# SubState, a subscriber's state for one delivery as the origin knows it (PENDING, ACCEPTED,
# SEEN), is compiled too: the records decode into it
from qrouter._fast.eo_core import SubState as SubState  # noqa: E402 (re-exported)


def encode_sub(sub: Sub) -> bytes:
    return json.dumps(list(sub), separators=(",", ":")).encode()


def decode_sub(raw: bytes) -> Sub:
    c, link = json.loads(raw)
    return (c, link)


def encode_att(att: AttId, stamp: int | None = None) -> bytes:
    value = [*att] if stamp is None else [*att, stamp]
    return json.dumps(value, separators=(",", ":")).encode()


def decode_att(raw: bytes) -> AttId:
    return decode_att_stamp(raw)[0]


def decode_att_stamp(raw: bytes) -> tuple[AttId, int | None]:
    """An attachment id and its stamp (None: written by an older version, without one)."""
    value = json.loads(raw)
    router, instance, n = value[:3]
    stamp = int(value[3]) if len(value) > 3 else None
    return (str(router), int(instance), int(n)), stamp


def sub_list(subs: Iterable[Sub]) -> list[list[str]]:
    return [list(s) for s in sorted(subs)]
