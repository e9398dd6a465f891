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
from dataclasses import dataclass, field
from enum import IntEnum
from functools import lru_cache

Sub = tuple[str, str]
"""A subscriber: (container-id, link name) of its receiving link."""
Pub = tuple[str, str]
"""A publisher: (container-id, link name) of its sending link."""
AttId = tuple[str, int, int]
"""One attachment of a subscriber link: (router id, router instance, counter)."""


class SubState(IntEnum):
    """A subscriber's state for one delivery, as the origin knows it."""

    PENDING = 0  # in doubt: not known to have accepted
    ACCEPTED = 1  # accepted (its client holds the delivery as accepted until settled)
    SEEN = 2  # settled, and known to have seen the settlement: nothing more is owed


class LocalState(IntEnum):
    """One local subscriber attachment's state for one delivery."""

    HELD = 0  # placeholder: reported unsettled (not accepted) on attach, message not here yet
    QUEUED = 1  # to be delivered, in the attachment's order
    DELIVERED = 2  # transfer sent, no outcome yet (in doubt)
    ACCEPTED = 3  # the subscriber accepted
    SETTLING = 4  # we settled it to the subscriber; waiting for its settle in return
    SEEN = 5  # the subscriber settled too (or never had it): nothing more to do


@dataclass(slots=True)
class OriginRecord:
    out_tag: bytes
    publisher: Pub
    tag: bytes
    body: bytes | None  # None: recovered from a store that lacked it (never sent empty)
    subs: dict[Sub, SubState]
    settled: bool = False  # the publisher settled (or forgot) the delivery
    # Not persisted: what has been sent in the current connection incarnations.
    accepted_sent: bool = False
    forwarded: set[AttId] = field(default_factory=set)
    filled: set[AttId] = field(default_factory=set)
    settle_sent: set[AttId] = field(default_factory=set)

    def pending(self) -> bool:
        return SubState.PENDING in self.subs.values()

    def done(self) -> bool:
        if not self.settled:
            return False
        for state in self.subs.values():
            if state != SubState.SEEN:
                return False
        return True

    def interested_routers(self, where: dict[Sub, set[str]]) -> dict[str, SubState]:
        """The seed's per-router view: each router holding some of our subscribers, with the
        least advanced state among them. `where`: subscriber -> routers it is attached at."""
        out: dict[str, SubState] = {}
        for sub, state in self.subs.items():
            for router in where.get(sub, ()):
                out[router] = min(out.get(router, state), state)
        return out

    def encode_state(self) -> bytes:
        """The durable state (`STATE_V2`): written once per loop iteration by the router's
        group commit, so it is a flat binary record rather than JSON."""
        subs = self.subs
        count, order = _layout(tuple(subs))
        out = [_V2_SETTLED if self.settled else _V2_OPEN, _pair(self.publisher), _lp(self.tag)]
        out.append(count)
        for sub, encoded in order:
            out.append(encoded)
            out.append(_STATE_BYTE[subs[sub]])
        return b"".join(out)

    @classmethod
    def decode(cls, out_tag: bytes, state: bytes, body: bytes | None) -> OriginRecord:
        if state[:1] == b"{":
            return cls._decode_json(out_tag, state, body)
        if state[:1] != STATE_V2 or len(state) < 2:
            raise ValueError("unknown origin record encoding")
        r = _Reader(state, 2)
        publisher = (r.text(), r.text())
        tag = r.field()
        subs = {}
        for _ in range(r.u32()):
            sub = (r.text(), r.text())
            subs[sub] = SubState(r.byte())
        if r.pos != len(state):
            raise ValueError("trailing bytes in origin record")
        return cls(out_tag, publisher, tag, body, subs, state[1] == 1)

    @classmethod
    def _decode_json(cls, out_tag: bytes, state: bytes, body: bytes | None) -> OriginRecord:
        """The encoding of releases before STATE_V2 (a store written by one of them)."""
        d = json.loads(state)
        subs = {(c, link): SubState(s) for c, link, s in d["subs"]}
        return cls(
            out_tag,
            (d["pub"][0], d["pub"][1]),
            bytes.fromhex(d["tag"]),
            body,
            subs,
            bool(d["settled"]),
        )


STATE_V2 = b"\x02"
"""Origin record state, version 2: 0x02, settled (1 byte), publisher container and link, the
original tag, the subscriber count (u32), then per subscriber (in sorted order) its container,
link and state (1 byte). Strings are UTF-8 and every variable field has a u32 big-endian
length prefix. Version 1 (JSON, first byte ``{``) is still read."""
_V2_OPEN = STATE_V2 + b"\x00"
_V2_SETTLED = STATE_V2 + b"\x01"
_STATE_BYTE = {s: bytes([int(s)]) for s in SubState}


def _lp(raw: bytes) -> bytes:
    return len(raw).to_bytes(4, "big") + raw


@lru_cache(maxsize=4096)
def _pair(pair: tuple[str, str]) -> bytes:
    """A subscriber's or publisher's (container, link), encoded once and reused."""
    return _lp(pair[0].encode()) + _lp(pair[1].encode())


@lru_cache(maxsize=1024)
def _layout(subs: tuple[Sub, ...]) -> tuple[bytes, tuple[tuple[Sub, bytes], ...]]:
    """The subscriber count and the subscribers in key order, each with its encoding: the
    same for every record of a topic while its subscribers do not change."""
    order = sorted(subs)
    return len(order).to_bytes(4, "big"), tuple((sub, _pair(sub)) for sub in order)


class _Reader:
    def __init__(self, raw: bytes, pos: int) -> None:
        self.raw = raw
        self.pos = pos

    def u32(self) -> int:
        end = self.pos + 4
        if end > len(self.raw):
            raise ValueError("truncated origin record")
        n = int.from_bytes(self.raw[self.pos : end], "big")
        self.pos = end
        return n

    def byte(self) -> int:
        if self.pos >= len(self.raw):
            raise ValueError("truncated origin record")
        self.pos += 1
        return self.raw[self.pos - 1]

    def field(self) -> bytes:
        n = self.u32()
        end = self.pos + n
        if end > len(self.raw):
            raise ValueError("truncated origin record")
        value = self.raw[self.pos : end]
        self.pos = end
        return bytes(value)

    def text(self) -> str:
        return self.field().decode()


@dataclass(slots=True)
class LocalRecord:
    out_tag: bytes
    body: bytes | None = None  # None: a placeholder, or a settled tombstone
    publisher: Pub | None = None
    tag: bytes | None = None
    drivers: set[str] = field(default_factory=set)  # routers that forwarded it: where ACCEPT goes
    subs: dict[AttId, LocalState] = field(default_factory=dict)
    settled: bool = False
    settled_epoch: int = 0  # barrier epoch when the settlement arrived (see protocol.py)
    settled_by: set[str] = field(default_factory=set)  # routers that want SEEN

    @property
    def placeholder(self) -> bool:
        return self.body is None and not self.settled

    def all_accepted(self) -> bool:
        if not self.subs:
            return False
        for s in self.subs.values():
            if s < LocalState.ACCEPTED:
                return False
        return True

    def all_seen(self) -> bool:
        for s in self.subs.values():
            if s != LocalState.SEEN:
                return False
        return True


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
