"""Every router's view of the topic's subscribers (the seed's subscriber announcements).

A subscriber is *known* from the first announcement of its attach until it detaches with
closed=true or stays unattached longer than the terminus timeout. Closing ends the terminus
(AMQP 1.0 §2.6.6), not the identity: a later attach with the same container-id and link name
is a new subscription. So a closure remembers the attachment that closed: that attachment's
claims stay refused (a late SUB for it), any other one re-opens the subscriber. While known,
every delivery published is owed to it. Each known subscriber has zero or more *claims*: attachments that a
router has announced and not withdrawn. Normally one; none while its router is down and it has
not re-attached elsewhere ("limbo"); transiently two during a failover, when the old router's
withdrawal has not arrived yet — deliveries are then forwarded to both and only the router
where the link really is delivers.

Which attachment is the newest decides whether a close ends the subscription, so every router
must agree on it whatever order the announcements arrive in: attachments are ordered by the
*stamp* their router gave them when the subscriber attached (a hybrid logical clock, see
`TopicRouter.attach_stamp`), ties broken by the id; two attachments of one router instance are
ordered by its counter. Without a stamp (a router of an older version) the order is unknown
and the last announcement to arrive counts as the newest, as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from qrouter.eo.records import AttId, Sub


@dataclass(slots=True)
class Claim:
    att: AttId
    sub: Sub
    unsettled: dict[bytes, bool]  # the map it attached with: tag -> accepted
    stamp: int | None = None  # its router's clock when it attached (None: an older router)


def newer(a: AttId, a_stamp: int | None, b: AttId, b_stamp: int | None) -> bool | None:
    """Is attachment `a` later than `b`? None if unknown (a stamp missing, other routers)."""
    if a[:2] == b[:2]:
        return a[2] > b[2]  # one router instance counts its attachments
    if a_stamp is None or b_stamp is None:
        return None
    return (a_stamp, a) > (b_stamp, b)


class SubscriberView:
    def __init__(self) -> None:
        self.known: dict[Sub, float | None] = {}  # sub -> in limbo since (None: claimed)
        # sub -> the attachment whose close=true ended it (None: not known, an older store)
        self.closed: dict[Sub, AttId | None] = {}
        # the latest claim added here, per subscriber; durable (the k/ value), so that after
        # a restart a late close of an attachment this router never saw claimed does not end
        # a subscription it did see (it stays known: in limbo at worst, until a claim or the
        # terminus timeout)
        self.last_att: dict[Sub, AttId] = {}
        self.claims: dict[AttId, Claim] = {}
        self._by_sub: dict[Sub, set[AttId]] = {}
        # counts the changes of `_by_sub` (the compiled driver keeps what it read from it
        # until this moves: eo_core's EoCore._c_drive_plan)
        self.gen = 0
        # the stamps of the attachments named above (claims, last_att, closed), and no others
        self.stamps: dict[AttId, int] = {}

    def stamp(self, att: AttId, stamp: int | None) -> None:
        """Remember `att`'s stamp (kept while `att` is named in the view)."""
        if stamp is not None:
            self.stamps[att] = stamp

    def _newer(self, a: AttId, b: AttId) -> bool | None:
        return newer(a, self.stamps.get(a), b, self.stamps.get(b))

    def _unname(self, att: AttId | None) -> None:
        """Forget `att`'s stamp once nothing in the view names it (memory bounded by the view)."""
        if att is None or att not in self.stamps or att in self.claims:
            return
        if att in self.last_att.values() or att in self.closed.values():
            return
        del self.stamps[att]

    def subscribers(self) -> list[Sub]:
        return sorted(self.known)

    def claims_of(self, sub: Sub) -> list[Claim]:
        return [self.claims[att] for att in sorted(self._by_sub.get(sub, ()))]

    def routers_of(self) -> dict[Sub, set[str]]:
        return {sub: {att[0] for att in atts} for sub, atts in self._by_sub.items()}

    def learn(self, sub: Sub, now: float) -> bool:
        """Know `sub` (in limbo until claimed); True if it was new."""
        if sub in self.known or sub in self.closed:
            return False
        self.known[sub] = None if self._by_sub.get(sub) else now
        return True

    def reopen(self, sub: Sub, att: AttId, stamp: int | None = None) -> bool:
        """A claim of closed `sub` by a later attachment than the one that closed it (or, not
        knowing the order, by another one): a new subscription (§2.6.6: the closed terminus
        is gone, this attach made a new one). True if `sub` was closed."""
        if sub not in self.closed:
            return False
        closing = self.closed[sub]
        if closing == att:
            return False
        if closing is not None:
            later = newer(att, stamp, closing, self.stamps.get(closing))
            if later is False:
                return False  # a late announcement of an attachment older than the close
        del self.closed[sub]
        self._unname(closing)
        return True

    def hear_latest(self, sub: Sub, att: AttId, stamp: int | None) -> tuple[bool, bool]:
        """A peer names `att` (stamped `stamp`) as the newest attachment of `sub` it knows
        (SUBS `latest`). If that is later than the attachment that closed `sub` here, `sub`
        subscribed again (its claim never reached us, or a crash lost what we heard); if later
        than our newest, it is our newest now. Only a known order counts. Returns (re-opened,
        newest changed)."""
        reopened = False
        if sub in self.closed:
            closing = self.closed[sub]
            if closing is None or newer(att, stamp, closing, self.stamps.get(closing)) is not True:
                return False, False
            del self.closed[sub]
            self._unname(closing)
            reopened = True
        elif sub not in self.known:
            return False, False
        last = self.last_att.get(sub)
        if last is not None and newer(att, stamp, last, self.stamps.get(last)) is not True:
            return reopened, False
        self.stamp(att, stamp)
        self.last_att[sub] = att
        self._unname(last)
        return reopened, True

    def add_claim(self, claim: Claim, now: float) -> bool:
        if claim.sub in self.closed:
            return False
        old = self.claims.get(claim.att)
        if old is not None:
            # announced again, stamped later (protocol._outlive): an attachment's stamp only grows
            if claim.stamp is not None and (old.stamp is None or claim.stamp > old.stamp):
                old.stamp = self.stamps[claim.att] = claim.stamp
                last = self.last_att.get(claim.sub)
                if last is not None and last != claim.att and self._newer(claim.att, last):
                    self.last_att[claim.sub] = claim.att
                    self._unname(last)
            return False
        self.learn(claim.sub, now)
        self.claims[claim.att] = claim
        self.stamp(claim.att, claim.stamp)
        last = self.last_att.get(claim.sub)
        if last is None or self._newer(claim.att, last) is not False:
            self.last_att[claim.sub] = claim.att  # the newest (by arrival if unknown)
            self._unname(last)
        self._by_sub.setdefault(claim.sub, set()).add(claim.att)
        self.gen += 1
        self.known[claim.sub] = None
        return True

    def remove_claim(self, att: AttId, now: float) -> Claim | None:
        claim = self.claims.pop(att, None)
        if claim is None:
            return None
        atts = self._by_sub[claim.sub]
        atts.discard(att)
        self.gen += 1
        if not atts:
            del self._by_sub[claim.sub]
            if claim.sub in self.known:
                self.known[claim.sub] = now
        self._unname(att)
        return claim

    def router_claims(self, router: str) -> list[Claim]:
        return [c for att, c in sorted(self.claims.items()) if att[0] == router]

    def close(self, sub: Sub, att: AttId | None = None, stamp: int | None = None) -> bool:
        """`sub`'s attachment `att` (stamped `stamp`) detached with closed=true: it is no
        longer subscribed, anywhere; unless a later attachment of it already re-subscribed
        (then only `att`'s claim goes). True if `sub` is closed now and was not before."""
        if att is not None:
            self.stamp(att, stamp)
        if sub in self.closed:
            closing = self.closed[sub]
            if att is not None and closing is not None and self._newer(att, closing):
                self.closed[sub] = att  # the latest close: older claims stay refused
                self._unname(closing)
            self._unname(att)
            return False
        if att is not None:
            others = self._by_sub.get(sub, set()) - {att}
            last = self.last_att.get(sub, att)
            # a later attachment claimed it (or may have: order unknown): a new subscription
            if any(self._newer(o, att) is not False for o in others) or (
                last != att and self._newer(last, att) is not False
            ):
                self.remove_claim(att, 0.0)
                if self.last_att.get(sub) == att:
                    self.last_att[sub] = max(others, key=self._order)
                self._unname(att)
                return False
        newest = self.last_att.pop(sub, None)
        self.closed[sub] = att
        self.known.pop(sub, None)
        for other in list(self._by_sub.get(sub, ())):
            self.remove_claim(other, 0.0)
        self._unname(newest)
        return True

    def _order(self, att: AttId) -> tuple[int, AttId]:
        return (self.stamps.get(att, -1), att)

    def forget(self, sub: Sub) -> None:
        """Terminus timeout: drop `sub` (it may come back later as a new subscriber)."""
        self.known.pop(sub, None)

    def expired(self, now: float, timeout: float) -> list[Sub]:
        return sorted(
            sub for sub, since in self.known.items() if since is not None and now - since > timeout
        )
