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
        return any(state == SubState.PENDING for state in self.subs.values())

    def done(self) -> bool:
        return self.settled and all(state == SubState.SEEN for state in self.subs.values())

    def interested_routers(self, where: dict[Sub, set[str]]) -> dict[str, SubState]:
        """The seed's per-router view: each router holding some of our subscribers, with the
        least advanced state among them. `where`: subscriber -> routers it is attached at."""
        out: dict[str, SubState] = {}
        for sub, state in self.subs.items():
            for router in where.get(sub, ()):
                out[router] = min(out.get(router, state), state)
        return out

    def encode_state(self) -> bytes:
        return json.dumps(
            {
                "pub": list(self.publisher),
                "tag": self.tag.hex(),
                "settled": int(self.settled),
                "subs": [[c, link, int(s)] for (c, link), s in sorted(self.subs.items())],
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, out_tag: bytes, state: bytes, body: bytes | None) -> OriginRecord:
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
        return bool(self.subs) and all(s >= LocalState.ACCEPTED for s in self.subs.values())

    def all_seen(self) -> bool:
        return all(s == LocalState.SEEN for s in self.subs.values())


def encode_sub(sub: Sub) -> bytes:
    return json.dumps(list(sub), separators=(",", ":")).encode()


def decode_sub(raw: bytes) -> Sub:
    c, link = json.loads(raw)
    return (c, link)


def encode_att(att: AttId) -> bytes:
    return json.dumps(list(att), separators=(",", ":")).encode()


def decode_att(raw: bytes) -> AttId:
    router, instance, n = json.loads(raw)
    return (str(router), int(instance), int(n))


def sub_list(subs: Iterable[Sub]) -> list[list[str]]:
    return [list(s) for s in sorted(subs)]
