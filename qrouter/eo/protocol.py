"""`TopicRouter`: one router's state machine for one guaranteed topic (docs/exactly-once.md).

Passive and deterministic, like the mesh engine: the router feeds it inputs (publisher and
subscriber link events, inter-router messages, `router_up` / `router_down`, `tick`) with the
current monotonic time, and it answers through a `Port`, after committing its durable
records to a `RecordStore`. It never reads a clock or touches a socket.

Roles for one delivery (outgoing tag t):

* The *driver* is the router where the publisher's link is attached. It records the delivery
  (`OriginRecord`) with every known subscriber PENDING, forwards it (FWD) to every attachment
  of every pending subscriber, accepts to the publisher once every subscriber has accepted, and
  relays the publisher's settlement (SETTLE) until every subscriber is SEEN.
* A router with subscriber attachments keeps a `LocalRecord`: it delivers what a driver
  targeted at one of its attachments, fills placeholders, accepts upstream (ACCEPT) once all its
  local subscribers of t have accepted, settles them on SETTLE and reports SEEN.
* An *ex-driver* holds origin records of a publisher whose link is no longer attached here
  (it left, or we restarted). It forwards nothing new; it asks the network (ASK) until the
  router now holding the publisher answers whether each delivery was settled (then it relays
  the settlement) or is live there (then it forgets the record: the new driver drives).

Safety rests on three rules (argued in docs/exactly-once.md, "Why no duplicates"):

1. A delivery is sent to a subscriber that did not report it on attach only when the *driver*
   targeted that very attachment (FWD targets). Only the driver targets, and only while the
   delivery is unsettled at the publisher, so the subscriber cannot have settled it.
2. A settled delivery is remembered (tombstone) at a subscriber's router until every local
   subscriber has seen the settlement *and* a PING/PONG barrier on every live channel has
   passed, so no FWD sent before the settlement can still arrive.
3. Attachment ids are unique (router, instance, counter): a FWD aimed at an old attachment is
   ignored.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from qrouter._fast.eo_core import EoCore
from qrouter._fast.eo_core import LocalSub as _LocalSub
from qrouter._fast.eo_core import PubLink as _PubLink
from qrouter.eo.messages import (
    ProtocolError,
    Wire,
    att_of,
    att_wire,
    make,
    map_of,
    map_wire,
    stamp_of,
    stamps_of,
    sub_of,
)
from qrouter.eo.port import Port
from qrouter.eo.records import (
    AttId,
    LocalRecord,
    LocalState,
    OriginRecord,
    Pub,
    Sub,
    SubState,
    decode_att_stamp,
    decode_sub,
    encode_att,
    encode_sub,
    sub_list,
)
from qrouter.eo.store import MemoryRecordStore, RecordStore
from qrouter.eo.view import Claim, SubscriberView, newer

EXACTLY_ONCE = "exactly-once"
AT_LEAST_ONCE = "at-least-once"
MODES = (EXACTLY_ONCE, AT_LEAST_ONCE)

UNSAFE = frozenset({"accept-early", "drop-on-settle"})
"""Deliberately broken variants, for tests that show the simulation catches them."""

MAX_CLOCK_AHEAD_MS = 60_000
"""A stamp heard this far ahead of our clock is not followed (attach_stamp)."""

# _PubLink (a publisher link attached here: attach_map, awaiting, owed) and _LocalSub (a
# subscriber attachment here: att, sub, attach_map, queue, resumable, stamp) are compiled with
# the per-message half of the state machine, EoCore (qrouter/_fast/eo_core.pyx, whose
# comments say what each field holds).


class TopicRouter(EoCore):
    """One router's state machine for one guaranteed topic. The per-message inputs
    (publisher_transfer, publisher_settled, subscriber_accepted, subscriber_settled, receive)
    and what they drive are EoCore's; the rest is here."""

    def __init__(
        self,
        router_id: str,
        port: Port,
        store: RecordStore | None = None,
        *,
        instance: int,
        topic: str = "",
        mode: str = EXACTLY_ONCE,
        terminus_timeout: float = 60.0,
        ask_interval: float = 1.0,
        now: float = 0.0,
        unsafe: Iterable[str] = (),
        first_att: int = 0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        self.unsafe = frozenset(unsafe)
        if not self.unsafe <= UNSAFE:
            raise ValueError(f"unknown unsafe variant(s) {sorted(self.unsafe - UNSAFE)}")
        self.router_id = router_id
        self.instance = instance
        self.topic = topic
        self.mode = mode
        self.eo = mode == EXACTLY_ONCE
        self.terminus_timeout = terminus_timeout
        self.ask_interval = ask_interval
        self._port = port
        self._store: RecordStore = store if store is not None else MemoryRecordStore()
        self._now = now
        self._view = SubscriberView()
        self._origins: dict[bytes, OriginRecord] = {}
        self._locals: dict[bytes, LocalRecord] = {}
        self._pubs: dict[Pub, _PubLink] = {}
        self._pub_gone: dict[Pub, float] = {}  # publishers with records here, link gone since
        self._pub_resend: dict[Pub, float] = {}  # re-attached without a map at: awaiting resends
        self._resent: dict[Pub, set[bytes]] = {}  # of those, the tags resent (bounded by records)
        self._subs: dict[AttId, _LocalSub] = {}
        self._next_att = first_att  # a topic made again in the same run continues its count
        # attachment stamps: a hybrid logical clock in ms, ahead of the wall clock `clock` and
        # of every stamp heard (attach_stamp)
        self._clock = clock
        self._hlc = 0
        self._up: set[str] = set()
        self._peers: set[str] = set()
        self._epoch = 0
        self._barrier: dict[str, int] = {}  # peer -> everything it sent before our PING(e) is in
        # peers that answered LACKING: no guarantee for this topic there, so no FWD of theirs
        # can be in flight and the barrier does not wait for them (issue 15 b)
        self._lacking: set[str] = set()
        # peers that read the per-message records (their SUBS said so): the others, routers
        # before the records, get FWD / ACCEPT / SETTLE / SEEN as maps (docs: "Messages")
        self._records_ok: set[str] = set()
        # of those, the peers that read them in the compact form (their SUBS said `compact`;
        # qrouter/_fast/eo_wire.pxi). QROUTER_EO_COMPACT=0 (tests: a router of the version
        # before, in a mesh of this one) neither says it nor sends it.
        self._compact = os.environ.get("QROUTER_EO_COMPACT", "1") != "0"
        self._compact_ok: set[str] = set()
        self._closed_since: dict[Sub, float] = {}  # closed subscribers: since when (this run)
        self._told_lacking: set[str] = set()  # logged once each
        self._next_ask = now
        self._puts: dict[bytes, bytes] = {}
        self._dels: set[bytes] = set()
        self._dirty: dict[bytes, OriginRecord] = {}  # o/<t> to write, encoded at the commit
        self._recover()

    # -- publisher link events ---------------------------------------------------------------

    def publisher_attached(
        self,
        pub: Pub,
        unsettled: Iterable[tuple[bytes, bool]],
        now: float,
        resumable: bool = True,
    ) -> None:
        """The publisher's link attached here with its unsettled map (tag -> has a terminal
        state, i.e. it saw ACCEPTED); empty for a new link. `resumable=False`: it sent no map
        at all (proton cannot, docs/client.md), so it cannot say what it settled; its
        unsettled deliveries wait `terminus_timeout` for it to resend them with the same tag
        (idempotent publishing, docs/exactly-once.md) and are abandoned after that."""
        self._now = now
        link = _PubLink(dict(unsettled), set())
        self._pubs[pub] = link
        gone = self._pub_gone.pop(pub, None)
        waiting = self._pub_resend.pop(pub, None)
        self._resent.pop(pub, None)
        if self.eo and not resumable:
            if any(not rec.settled for rec in self._records_of(pub)):
                # the clock runs from its first disconnect: reconnecting does not extend it
                self._pub_resend[pub] = min(t for t in (gone, waiting, now) if t is not None)
        elif self.eo:
            for rec in self._records_of(pub):
                if not rec.settled and link.attach_map.get(rec.tag) is not False:
                    self._settle_origin(rec)  # the publisher settled it, or forgot it
        resend = [
            tag
            for tag, accepted in link.attach_map.items()
            if not accepted and self._body_missing(self._tag(pub, tag))
        ]
        if resend:
            link.awaiting.update(resend)
            self._emit("resend", pub, resend)
        for rec in self._records_of(pub):
            if not rec.settled:
                rec.accepted_sent = False
                self._drive(rec)
                self._check_accept(rec)
        self._flush()

    def publisher_detached(self, pub: Pub, closed: bool, now: float) -> None:
        self._now = now
        waiting = self._pub_resend.pop(pub, None)  # _pub_gone's clock takes over from it
        self._resent.pop(pub, None)
        if self._pubs.pop(pub, None) is not None:
            for rec in self._records_of(pub):
                if rec.settled:
                    continue
                if not self.eo:
                    self._delete_origin(rec)  # the publisher resends what it did not settle
                elif closed:
                    self._settle_origin(rec)  # its terminus is gone: nobody will resend
                else:
                    self._pub_gone[pub] = now if waiting is None else waiting
        self._flush()

    # -- subscriber link events --------------------------------------------------------------

    def new_attachment_id(self) -> AttId:
        """Reserve the id of the next subscriber attachment, so the caller can map it to the
        link before `subscriber_attached` produces output for it."""
        self._next_att += 1
        return (self.router_id, self.instance, self._next_att)

    def attach_stamp(self) -> int:
        """The stamp of an attachment made now: greater than every stamp this router gave or
        heard before (so an attachment made after its router heard of another one is later),
        and at least the wall clock in ms (so an attachment made after another one's close,
        told only by the client, is later too unless the clocks differ by more than the time
        the client took to attach again). Stamps from the store count as heard: the order
        survives a restart even if the clock went back."""
        self._hlc = max(self._hlc + 1, int(self._clock() * 1000))
        return self._hlc

    def _heard_stamp(self, stamp: int | None) -> None:
        # a peer's clock far ahead (broken, or hostile) must not drag ours along with it
        if stamp is not None and self._hlc < stamp <= self._clock() * 1000 + MAX_CLOCK_AHEAD_MS:
            self._hlc = stamp

    def subscriber_attached(
        self,
        sub: Sub,
        unsettled: Iterable[tuple[bytes, bool]],
        now: float,
        att: AttId | None = None,
        *,
        resumable: bool = True,
    ) -> AttId:
        """A subscriber link attached here with its unsettled map (out tag -> accepted), in
        delivery order; returns the attachment id the other calls name it by (`att` if one was
        reserved with `new_attachment_id`). `resumable=False` for a client that cannot resume
        its link (python-qpid-proton: no unsettled map): it is counted as having seen a
        settlement as soon as the settle is sent, since it can never report it again."""
        self._now = now
        if att is None:
            att = self.new_attachment_id()
        elif att[:2] != (self.router_id, self.instance) or att in self._subs:
            raise ValueError(f"attachment id {att} is not a fresh one of this router")
        amap = dict(unsettled) if self.eo else {}
        ls = _LocalSub(att, sub, amap, deque(), resumable, self.attach_stamp())
        self._subs[att] = ls
        touched = []
        for out_tag, accepted in amap.items():
            rec = self._locals.get(out_tag)
            if rec is None:
                rec = LocalRecord(out_tag)  # a placeholder
                self._put_local(out_tag, rec)  # (marked held: EoCore._c_local)
            if rec.settled:
                rec.set_sub(att, LocalState.SETTLING)
                self._emit("settle_subscriber", att, out_tag)
            elif accepted:
                rec.set_sub(att, LocalState.ACCEPTED)
            else:
                rec.set_sub(att, LocalState.QUEUED if rec.body is not None else LocalState.HELD)
                ls.queue.append(out_tag)
            touched.append(rec)
        self._pump(ls)
        for rec in touched:
            self._check_local_accept(rec)
        claim = Claim(att, sub, amap, ls.stamp)
        self._broadcast(
            make(
                "SUB",
                self.topic,
                att=att_wire(att),
                sub=list(sub),
                map=map_wire(amap),
                at=ls.stamp,
            )
        )
        self._claim_added(claim)
        self._flush()
        return att

    def subscriber_detached(self, att: AttId, closed: bool, now: float) -> None:
        self._now = now
        ls = self._subs.pop(att, None)
        if ls is not None:
            ls.detached()
            self._detach_locals(att)  # (every local record: in the engine)
            msg = make(
                "UNSUB",
                self.topic,
                att=att_wire(att),
                sub=list(ls.sub),
                closed=int(closed),
                at=ls.stamp,
            )
            self._broadcast(msg)
            self._view.remove_claim(att, now)
            if closed:
                self._close_sub(ls.sub, att, ls.stamp)
        self._flush()

    # -- the mesh ----------------------------------------------------------------------------

    def router_up(self, peer: str, now: float) -> None:
        """The FIFO channel to `peer` is open (again): send it our subscribers."""
        self._now = now
        self._up.add(peer)
        self._peers.add(peer)
        self._lacking.discard(peer)  # it may carry the topic now: its next answer tells
        attached = [
            [att_wire(ls.att), list(ls.sub), map_wire(ls.attach_map)] for ls in self._subs.values()
        ]
        last_att = self._view.last_att
        latest = [(sub, last_att[sub]) for sub in sorted(self._view.known) if sub in last_att]
        self._to_router(
            peer,
            make(
                "SUBS",
                self.topic,
                instance=self.instance,
                attached=attached,
                known=sub_list(self._view.known),
                closed=sub_list(self._view.closed),
                records=1,  # we read the per-message records (an older router ignores this)
                # and their compact form (eo_wire.pxi; a router without it: no such key)
                **({"compact": 1} if self._compact else {}),
                # which attachment closed each: a later one re-subscribes (view.py)
                closed_at=[
                    [list(sub), att_wire(att) if att is not None else None]
                    for sub, att in sorted(self._view.closed.items())
                ],
                # the newest attachment of each known subscriber: one later than a close
                # re-opens it there (view.hear_latest)
                latest=[[list(sub), att_wire(att)] for sub, att in latest],
                # the stamps of the attachments named above: their order (view.py)
                stamps=[[att_wire(ls.att), ls.stamp] for ls in self._subs.values()]
                + [
                    [att_wire(att), self._view.stamps[att]]
                    for att in sorted(
                        {a for a in self._view.closed.values() if a is not None}
                        | {att for _, att in latest}
                    )
                    if att in self._view.stamps
                ],
            ),
        )
        self._flush()

    def router_down(self, peer: str, now: float) -> None:
        """The channel to `peer` broke (or `peer` is unreachable, or restarted): what was in
        flight either way is lost."""
        self._now = now
        self._up.discard(peer)
        self._records_ok.discard(peer)  # (it may come back as another version: SUBS tells)
        self._compact_ok.discard(peer)
        for claim in self._view.router_claims(peer):
            self._view.remove_claim(claim.att, now)
        self._forget_sent_to(peer)  # the records' forwarded / filled / settle_sent
        self._epoch += 1
        self._barrier[peer] = self._epoch
        self._flush()

    def tick(self, now: float) -> None:
        self._now = now
        if self.eo:
            self._epoch += 1
            # the barrier is only for tombstones: with none waiting, no PING (issue 15 c)
            if self._any_settled_local():
                for peer in sorted(self._up - self._lacking):
                    self._to_router(peer, make("PING", self.topic, e=self._epoch))
            if now >= self._next_ask:
                self._next_ask = now + self.ask_interval
                self._ask()
            for pub, since in list(self._pub_gone.items()):
                if now - since > self.terminus_timeout:
                    del self._pub_gone[pub]
                    for rec in self._records_of(pub):
                        if not rec.settled:
                            self._settle_origin(rec)  # abandoned: its terminus expired
            for pub, since in list(self._pub_resend.items()):
                if now - since > self.terminus_timeout:
                    del self._pub_resend[pub]
                    sent = self._resent.pop(pub, set())
                    for rec in self._records_of(pub):
                        if not rec.settled and rec.tag not in sent:
                            self._settle_origin(rec)  # abandoned: not resent in time
            if self._closed_since:  # records handed over with a closed subscriber in them
                for rec in [r for r in self._origins.values() if r.settled]:
                    self._maybe_drop_origin(rec)
                for sub, since in list(self._closed_since.items()):
                    if now - since > self.terminus_timeout:
                        del self._closed_since[sub]  # long closed: _long_closed without it
            self._drop_settled_locals()  # (the settled ones only, not every record)
        self._trim_rings()  # (records gone from `_locals` not kept alive by a hint)
        for sub in self._view.expired(now, self.terminus_timeout):
            self._log("info", f"subscriber {sub} did not re-attach in time: discarded")
            self._view.forget(sub)
            self._del(b"k/" + encode_sub(sub))
            self._drop_sub_from_records(sub)
        self._flush()

    # -- introspection -----------------------------------------------------------------------

    @property
    def view(self) -> SubscriberView:
        return self._view

    def origin_records(self) -> dict[bytes, OriginRecord]:
        return dict(self._origins)

    def local_records(self) -> dict[bytes, LocalRecord]:
        return dict(self._locals)

    def origin_of(self, out_tag: bytes) -> tuple[Pub, bytes] | None:
        """The publisher and its tag of a delivery this router delivers (for the journal)."""
        rec = self._locals.get(out_tag)
        if rec is None or rec.publisher is None or rec.tag is None:
            return None
        return rec.publisher, rec.tag

    def attached_subscribers(self) -> dict[AttId, Sub]:
        return {att: ls.sub for att, ls in self._subs.items()}

    def attached_publishers(self) -> list[Pub]:
        return sorted(self._pubs)

    @property
    def next_att(self) -> int:
        return self._next_att

    def idle(self) -> bool:
        """Nothing here for anyone: no link, no subscriber known or claimed anywhere, no
        record, no publisher awaited. The embedding may then drop this state machine (issue
        15 c); made again, it recovers the same from the store (the closed subscribers)."""
        return not (
            self._pubs
            or self._subs
            or self._origins
            or self._locals
            or self._pub_gone
            or self._pub_resend
            or self._view.known
            or self._view.claims
        )

    def lacking_routers(self) -> list[str]:
        """Routers reachable now that do not carry this topic's guarantee (LACKING)."""
        return sorted(self._lacking & self._up)

    # -- the driver side ---------------------------------------------------------------------

    def _ask(self) -> None:
        orphans: dict[Pub, list[bytes]] = {}
        for rec in self._origins.values():
            if not rec.settled and rec.publisher not in self._pubs:
                orphans.setdefault(rec.publisher, []).append(rec.tag)
        for pub, tags in sorted(orphans.items()):
            # with whom each is still owed to: the router that answers "live" drives it from
            # then on and must not drop a subscriber only we knew (issue 15 f)
            owed = [
                [
                    tag,
                    [[*sub, int(st)] for sub, st in sorted(rec.subs.items()) if st < SubState.SEEN],
                ]
                for tag in tags
                for rec in [self._origins[self._tag(pub, tag)]]
            ]
            self._broadcast(make("ASK", self.topic, pub=list(pub), tags=tags, owed=owed))

    def _merge_owed(self, rec: OriginRecord, owed: dict[Sub, SubState]) -> None:
        """Add the subscribers an ex-driver owed `rec` to that it does not list yet."""
        changed = False
        for sub, state in owed.items():
            # closed here, it may have subscribed again (the claim that re-opens it is on its
            # way): kept, but while closed here it neither holds the publisher's ACCEPTED back
            # nor the record once settled
            if rec.add_sub(sub, state):
                changed = True
        if changed and not rec.settled:
            self._save_origin(rec)
            self._drive(rec)

    def _records_of(self, pub: Pub) -> list[OriginRecord]:
        return [rec for rec in self._origins.values() if rec.publisher == pub]

    def _claim_added(self, claim: Claim) -> None:
        self._heard_stamp(claim.stamp)
        if self._view.reopen(claim.sub, claim.att, claim.stamp):
            self._closed_since.pop(claim.sub, None)
            self._del(b"c/" + encode_sub(claim.sub))
            self._log("info", f"subscriber {claim.sub} subscribes again after it closed")
        if self._view.learn(claim.sub, self._now):
            self._put(b"k/" + encode_sub(claim.sub), b"")
        if self._view.add_claim(claim, self._now):
            # its latest attachment seen here, kept across a restart: a late close of
            # another one must not end this subscription (view.close)
            last = self._view.last_att[claim.sub]
            self._put(b"k/" + encode_sub(claim.sub), encode_att(last, self._view.stamps.get(last)))
            for rec in list(self._origins.values()):
                if rec.has_sub(claim.sub):
                    self._drive(rec)

    def _close_sub(self, sub: Sub, att: AttId | None = None, stamp: int | None = None) -> None:
        self._heard_stamp(stamp)
        live = [ls for ls in self._subs.values() if ls.sub == sub and ls.att != att]
        if att is not None and live:
            self._outlive(live, att, stamp)
            return
        if self._view.close(sub, att, stamp):
            self._closed_since[sub] = self._now
            self._put(b"c/" + encode_sub(sub), b"" if att is None else encode_att(att, stamp))
            self._del(b"k/" + encode_sub(sub))
            self._drop_sub_from_records(sub)

    def _outlive(self, live: list[_LocalSub], att: AttId, stamp: int | None) -> None:
        """A close of `att` while the same subscriber's link is attached here: a link is
        attached at one router at a time (decision 6), so `att` is the older one whatever the
        stamps say (clocks differing by more than the client took to attach again). Only its
        claim goes; ours is stamped again, later than it, and announced again, so that every
        router orders the two as we do and a router that closed the subscriber re-opens it."""
        self._view.remove_claim(att, self._now)
        for ls in live:
            if newer(ls.att, ls.stamp, att, stamp) is True:
                continue
            ls.stamp = max(self.attach_stamp(), (stamp or 0) + 1)
            self._hlc = max(self._hlc, ls.stamp)
            claim = self._view.claims.get(ls.att)
            if claim is not None:
                claim.stamp = ls.stamp
            self._view.stamp(ls.att, ls.stamp)
            self._view.last_att[ls.sub] = ls.att
            self._put(b"k/" + encode_sub(ls.sub), encode_att(ls.att, ls.stamp))
            self._log("info", f"subscriber {ls.sub}: close of older {att} after its attach here")
            self._broadcast(
                make(
                    "SUB",
                    self.topic,
                    att=att_wire(ls.att),
                    sub=list(ls.sub),
                    map=map_wire(ls.attach_map),
                    at=ls.stamp,
                )
            )

    def _drop_sub_from_records(self, sub: Sub) -> None:
        for rec in list(self._origins.values()):
            if rec.pop_sub(sub) is not None:
                self._save_origin(rec)
                self._check_accept(rec)
                self._maybe_drop_origin(rec)

    # -- inter-router messages ---------------------------------------------------------------

    def _handle_other(self, sender: str, msg: Wire) -> None:
        """The messages that are not per delivery (EoCore._handle dispatches FWD, ACCEPT,
        SETTLE, SEEN, PING and PONG itself)."""
        op = msg["op"]
        if op == "SUB":
            claim = Claim(att_of(msg["att"]), sub_of(msg["sub"]), map_of(msg["map"]))
            claim.stamp = stamp_of(msg.get("at"))
            self._claim_added(claim)
        elif op == "UNSUB":
            att = att_of(msg["att"])
            stamp = stamp_of(msg.get("at"))
            self._view.remove_claim(att, self._now)
            if msg["closed"]:
                self._close_sub(sub_of(msg["sub"]), att, stamp)
        elif op == "SUBS":
            if msg.get("records") == 1:
                self._records_ok.add(sender)
            else:
                self._records_ok.discard(sender)
            if self._compact and msg.get("compact") == 1:
                self._compact_ok.add(sender)
            else:
                self._compact_ok.discard(sender)
            self._on_snapshot(sender, msg)
        elif op == "ASK":
            self._on_ask(sender, msg)
        elif op == "ANSWER":
            self._on_answer(msg)
        elif op == "LACKING":
            self._on_lacking(sender)

    def _on_lacking(self, sender: str) -> None:
        """`sender` has no guarantee for this topic (a configuration mismatch): it holds no
        subscriber and sends no FWD, so the barrier stops waiting for it (until the channel
        re-synchronises: `router_up`). Logged once per peer."""
        if sender in self._lacking:
            return
        self._lacking.add(sender)
        if sender not in self._told_lacking:
            self._told_lacking.add(sender)
            self._log("error", f"router {sender} has no guarantee for this topic: configure it")
        if self.eo:
            self._drop_settled_locals()  # (the settled ones only, not every record)
        else:
            for rec in [r for r in self._locals.values() if r.settled]:
                self._maybe_drop_local(rec)

    def _on_snapshot(self, sender: str, msg: Wire) -> None:
        closed_at = msg.get("closed_at")
        latest = msg.get("latest")
        if latest is not None and (not isinstance(latest, list) or len(latest) > len(msg["known"])):
            raise ProtocolError("bad latest list")
        limit = len(msg["attached"]) + len(latest or ())
        limit += len(closed_at) if isinstance(closed_at, list) else 0
        stamps = stamps_of(msg.get("stamps"), limit)
        if isinstance(closed_at, list):
            for raw_sub, raw_att in closed_at:
                att = None if raw_att is None else att_of(raw_att)
                self._close_sub(sub_of(raw_sub), att, stamps.get(att) if att else None)
        else:  # a router that does not say which attachment closed
            for raw in msg["closed"]:
                self._close_sub(sub_of(raw))
        for raw in msg["known"]:
            sub = sub_of(raw)
            if self._view.learn(sub, self._now):
                self._put(b"k/" + encode_sub(sub), b"")
        for entry in latest or ():
            if not (isinstance(entry, list) and len(entry) == 2):
                raise ProtocolError(f"bad latest entry {entry!r}")
            sub, att = sub_of(entry[0]), att_of(entry[1])
            stamp = stamps.get(att)
            self._heard_stamp(stamp)
            reopened, newest = self._view.hear_latest(sub, att, stamp)
            if reopened:
                self._closed_since.pop(sub, None)
                self._del(b"c/" + encode_sub(sub))
                self._view.learn(sub, self._now)  # in limbo until its claim comes
                self._log("info", f"subscriber {sub} subscribed again after it closed ({sender})")
            if newest:
                self._put(b"k/" + encode_sub(sub), encode_att(att, stamp))
        claims = [Claim(att_of(a), sub_of(s), map_of(m)) for a, s, m in msg["attached"]]
        for claim in claims:
            claim.stamp = stamps.get(claim.att)
        fresh = {c.att for c in claims}
        for old in self._view.router_claims(sender):
            if old.att not in fresh:
                self._view.remove_claim(old.att, self._now)
        for claim in claims:
            self._claim_added(claim)

    def _on_ask(self, sender: str, msg: Wire) -> None:
        pub = sub_of(msg["pub"])
        link = self._pubs.get(pub)
        if link is None:
            return  # only the router holding the publisher's link answers
        settled: list[bytes] = []
        live: list[bytes] = []
        owed = _owed_of(msg.get("owed"))
        for tag in msg["tags"]:
            rec = self._origins.get(self._tag(pub, tag))
            if rec is not None:
                (settled if rec.settled else live).append(tag)
                if not rec.settled:
                    self._merge_owed(rec, owed.get(tag, {}))
            elif tag in link.awaiting:
                live.append(tag)  # we asked the publisher to resend it
                if tag in owed:
                    link.owed[tag] = owed[tag]
            else:
                settled.append(tag)  # it was sent before the attach and not in its map
        answer = make("ANSWER", self.topic, pub=list(pub), settled=settled, live=live)
        self._to_router(sender, answer)

    def _on_answer(self, msg: Wire) -> None:
        pub = sub_of(msg["pub"])
        for tag in msg["settled"]:
            rec = self._origins.get(self._tag(pub, tag))
            if rec is not None and not rec.settled:
                self._settle_origin(rec)
        if pub in self._pubs:
            return  # we drive this publisher again: our records are current
        for tag in msg["live"]:
            rec = self._origins.get(self._tag(pub, tag))
            if rec is not None and not rec.settled:
                self._delete_origin(rec)  # its driver now is the router that answered

    # -- plumbing ----------------------------------------------------------------------------

    def _body_missing(self, out_tag: bytes) -> bool:
        rec = self._origins.get(out_tag)
        return rec is None or rec.body is None

    def _recover(self) -> None:
        # Both modes keep the subscriber view: a restarted router must still owe new
        # deliveries to subscribers that are in limbo or whose router it has not heard yet.
        for key, value in self._store.scan(b"c/"):
            att, stamp = decode_att_stamp(value) if value else (None, None)
            self._view.close(decode_sub(key[2:]), att, stamp)
            self._closed_since[decode_sub(key[2:])] = self._now
            self._hlc = max(self._hlc, stamp or 0)
        for key, value in self._store.scan(b"k/"):
            sub = decode_sub(key[2:])
            self._view.learn(sub, self._now)
            if value:
                att, stamp = decode_att_stamp(value)
                self._view.last_att[sub] = att
                self._view.stamp(att, stamp)
                self._hlc = max(self._hlc, stamp or 0)
        if not self.eo:
            return
        bodies = {key[2:]: value for key, value in self._store.scan(b"m/")}
        for key, value in self._store.scan(b"o/"):
            out_tag = key[2:]
            # never an empty body in place of a missing one (issue 15 d): a record without
            # its message forwards nothing; its publisher is asked to resend it
            body = bodies.get(out_tag)
            if body is None:
                self._log("error", f"record {out_tag.hex()[:16]} has no message body in the store")
            rec = OriginRecord.decode(out_tag, value, body)
            self._origins[out_tag] = rec
            if not rec.settled:
                self._pub_gone[rec.publisher] = self._now

    def _broadcast(self, msg: Wire) -> None:
        for peer in sorted(self._up):
            self._to_router(peer, msg)


def _owed_of(value: Any) -> dict[bytes, dict[Sub, SubState]]:
    """ASK's optional `owed`: [[tag, [[container, link, state], ...]], ...] (hostile input:
    anything malformed is left out)."""
    out: dict[bytes, dict[Sub, SubState]] = {}
    if not isinstance(value, list):
        return out
    for entry in value:
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], bytes)):
            continue
        subs: dict[Sub, SubState] = {}
        for item in entry[1] if isinstance(entry[1], list) else ():
            if (
                isinstance(item, list)
                and len(item) == 3
                and isinstance(item[0], str)
                and isinstance(item[1], str)
                and item[2] in (SubState.PENDING, SubState.ACCEPTED)
                and not isinstance(item[2], bool)
            ):
                subs[(item[0], item[1])] = SubState(item[2])
        out[entry[0]] = subs
    return out
