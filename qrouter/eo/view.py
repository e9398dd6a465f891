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
"""

from __future__ import annotations

from dataclasses import dataclass

from qrouter.eo.records import AttId, Sub


@dataclass(slots=True)
class Claim:
    att: AttId
    sub: Sub
    unsettled: dict[bytes, bool]  # the map it attached with: tag -> accepted


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

    def reopen(self, sub: Sub, att: AttId) -> bool:
        """A claim of closed `sub` by another attachment than the one that closed it: a new
        subscription (§2.6.6: the closed terminus is gone, this attach made a new one). True
        if `sub` was closed."""
        if sub not in self.closed or self.closed[sub] == att:
            return False
        del self.closed[sub]
        return True

    def add_claim(self, claim: Claim, now: float) -> bool:
        if claim.sub in self.closed or claim.att in self.claims:
            return False
        self.learn(claim.sub, now)
        self.claims[claim.att] = claim
        self.last_att[claim.sub] = claim.att
        self._by_sub.setdefault(claim.sub, set()).add(claim.att)
        self.known[claim.sub] = None
        return True

    def remove_claim(self, att: AttId, now: float) -> Claim | None:
        claim = self.claims.pop(att, None)
        if claim is None:
            return None
        atts = self._by_sub[claim.sub]
        atts.discard(att)
        if not atts:
            del self._by_sub[claim.sub]
            if claim.sub in self.known:
                self.known[claim.sub] = now
        return claim

    def router_claims(self, router: str) -> list[Claim]:
        return [c for att, c in sorted(self.claims.items()) if att[0] == router]

    def close(self, sub: Sub, att: AttId | None = None) -> bool:
        """`sub`'s attachment `att` detached with closed=true: it is no longer subscribed,
        anywhere; unless a later attachment of it already re-subscribed (then only `att`'s
        claim goes). True if `sub` is closed now and was not before."""
        if sub in self.closed:
            return False
        if att is not None:
            others = self._by_sub.get(sub, set()) - {att}
            if others or self.last_att.get(sub, att) != att:
                # a later attachment claimed it (or claims do now): a new subscription
                self.remove_claim(att, 0.0)
                if others and self.last_att.get(sub) == att:
                    self.last_att[sub] = max(others)
                return False
        self.closed[sub] = att
        self.last_att.pop(sub, None)
        self.known.pop(sub, None)
        for att in list(self._by_sub.get(sub, ())):
            self.remove_claim(att, 0.0)
        return True

    def forget(self, sub: Sub) -> None:
        """Terminus timeout: drop `sub` (it may come back later as a new subscriber)."""
        self.known.pop(sub, None)

    def expired(self, now: float, timeout: float) -> list[Sub]:
        return sorted(
            sub for sub, since in self.known.items() if since is not None and now - since > timeout
        )
