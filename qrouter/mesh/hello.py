"""Hello protocol: who is on the other end of each inter-router connection, and is it two-way.

Per connection ("link") we keep the last HELLO heard: the router id and instance it claims,
and whether it listed us in ``seen``. A neighbour is *adjacent* when one of its connections is
accepted, fresh (heard within hello_max_age) and two-way (it hears us too). Only adjacencies go
into our link state; a one-way connection carries no traffic, because a router that cannot hear
us would never send the acknowledgements back.

A HELLO is sent on every link each hello_interval, and at once when a link comes up or when
the peer shows it does not hear us yet (a new neighbour or one that restarted), so an adjacency
forms in one round trip rather than one interval.

Refused links (docs/mesh.md, "Duplicate router ids"): a link whose peer claims our own id, or
claims the id of a router already adjacent on another link with a different instance, is
refused: we keep reading its HELLOs (to re-evaluate) but send ``seen = []`` on it and take no
other message from it. Parallel links to the same router instance are all accepted; the
cheapest (then lowest link id) carries the traffic.
"""

from __future__ import annotations

from dataclasses import dataclass

from qrouter.mesh.messages import Hello


@dataclass(slots=True)
class _Link:
    link_id: int
    cost: int
    claim_id: str | None = None  # id in the last fresh HELLO; None when never heard or expired
    claim_instance: int = 0
    sees_us: bool = False
    last_heard: float = 0.0
    accepted_at: float | None = None  # None: refused (or not heard yet)
    refusal: str | None = None  # why, as last logged
    next_hello: float | None = None  # None: at the next tick


@dataclass(frozen=True, slots=True)
class Adjacency:
    link_id: int
    cost: int
    instance: int


class HelloProtocol:
    def __init__(self, router_id: str, instance: int, interval: float, max_age: float) -> None:
        self.router_id = router_id
        self.instance = instance
        self.interval = interval
        self.max_age = max_age
        self._links: dict[int, _Link] = {}
        self._conflict_since: dict[str, float] = {}  # id -> when two instances first collided
        self.duplicate_ids: set[str] = set()
        self.pending_log: list[tuple[str, str]] = []  # (level, text), drained by the engine

    # -- events ------------------------------------------------------------------------------

    def link_up(self, link_id: int, cost: int) -> Hello:
        self._links[link_id] = _Link(link_id, cost)
        return self._hello_for(self._links[link_id])

    def link_down(self, link_id: int, now: float) -> None:
        self._links.pop(link_id, None)
        self._evaluate(now)

    def is_up(self, link_id: int) -> bool:
        return link_id in self._links

    def accepts(self, link_id: int) -> bool:
        """Messages other than HELLO are taken only from links with an accepted peer."""
        link = self._links.get(link_id)
        return link is not None and link.claim_id is not None and link.accepted_at is not None

    def receive(self, link_id: int, hello: Hello, now: float) -> Hello | None:
        """Record a HELLO; return a HELLO to send back at once, if one is due."""
        link = self._links[link_id]
        new_peer = link.claim_id != hello.id or link.claim_instance != hello.instance
        link.claim_id = hello.id
        link.claim_instance = hello.instance
        link.sees_us = self.router_id in hello.seen
        link.last_heard = now
        if new_peer:
            link.accepted_at = None
        self._evaluate(now)
        since = self._conflict_since.get(hello.id)
        if link.accepted_at is not None and since is not None and since < now:
            # The incumbent instance spoke again after the other one appeared: both processes
            # are alive, so this is not a restart racing the old connection's close.
            self._duplicate(hello.id, f"router id {hello.id!r} is used by two live instances")
        if link.accepted_at is not None and (new_peer or not link.sees_us):
            return self._hello_for(link)
        return None

    def expire(self, now: float) -> None:
        for link in self._links.values():
            if link.claim_id is not None and now - link.last_heard > self.max_age:
                link.claim_id = None
                link.sees_us = False
                link.accepted_at = None
                link.refusal = None
        self._evaluate(now)

    def due(self, now: float) -> list[tuple[int, Hello]]:
        out = []
        for link in self._links.values():
            if link.next_hello is None or now >= link.next_hello:
                link.next_hello = now + self.interval
                out.append((link.link_id, self._hello_for(link)))
        return out

    def next_due(self) -> float:
        """When `due` or `expire` next has work: the earliest HELLO to send (-inf: a link
        that has sent none yet) or claim to age out (it does once older than max_age)."""
        at = float("inf")
        for link in self._links.values():
            if link.next_hello is None:
                return float("-inf")
            at = min(at, link.next_hello)
            if link.claim_id is not None:
                at = min(at, link.last_heard + self.max_age)
        return at

    # -- state -------------------------------------------------------------------------------

    def adjacencies(self) -> dict[str, Adjacency]:
        best: dict[str, Adjacency] = {}
        for link in self._links.values():
            if link.claim_id is None or link.accepted_at is None or not link.sees_us:
                continue
            current = best.get(link.claim_id)
            if current is None or (link.cost, link.link_id) < (current.cost, current.link_id):
                best[link.claim_id] = Adjacency(link.link_id, link.cost, link.claim_instance)
        return best

    def peer_on(self, link_id: int) -> str | None:
        """The router id accepted on a link (None: nobody accepted there)."""
        link = self._links.get(link_id)
        return link.claim_id if link is not None and link.accepted_at is not None else None

    def refused_links(self) -> dict[int, str]:
        return {
            link.link_id: link.refusal
            for link in self._links.values()
            if link.refusal is not None and link.claim_id is not None
        }

    # -- internals ---------------------------------------------------------------------------

    def _hello_for(self, link: _Link) -> Hello:
        seen = (link.claim_id,) if link.claim_id and link.accepted_at is not None else ()
        return Hello(self.router_id, self.instance, seen)

    def _evaluate(self, now: float) -> None:
        """Decide, for every link with a fresh claim, whether it is accepted or refused."""
        by_id: dict[str, list[_Link]] = {}
        for link in self._links.values():
            if link.claim_id is None or now - link.last_heard > self.max_age:
                continue  # a stale claim (expire() has not run yet) competes with nobody
            if link.claim_id == self.router_id:
                if link.claim_instance != self.instance:
                    self._duplicate(
                        self.router_id,
                        f"link {link.link_id}: peer claims our router id {self.router_id!r} "
                        f"(instance {link.claim_instance}, ours {self.instance})",
                    )
                    self._refuse(link, "peer claims our router id", "error")
                else:
                    self._refuse(link, "connection to ourselves", "error")
                continue
            by_id.setdefault(link.claim_id, []).append(link)

        for router_id, links in by_id.items():
            instances = {link.claim_instance for link in links}
            if len(instances) == 1:
                self._conflict_since.pop(router_id, None)
                for link in links:
                    self._accept(link, now)
                continue
            # Two instances of one id on different links. The one accepted first keeps its
            # place; the newcomer waits. A restarted router whose old connection has not been
            # closed yet gets in once that connection ages out (at most hello_max_age), and a
            # real duplicate is confirmed when the incumbent keeps talking (see receive()).
            accepted = [link for link in links if link.accepted_at is not None]
            if accepted:
                incumbent = min(accepted, key=lambda x: (x.accepted_at or 0.0, x.link_id))
                keep = incumbent.claim_instance
            else:
                keep = max(instances)
            self._conflict_since.setdefault(router_id, now)
            for link in links:
                if link.claim_instance == keep:
                    self._accept(link, now)
                else:
                    # A warning until confirmed: most often this is a restart.
                    self._refuse(
                        link,
                        f"router id {router_id!r} is already connected as another instance",
                        "warning",
                    )
        for router_id in list(self._conflict_since):
            if router_id not in by_id:
                del self._conflict_since[router_id]

    def _accept(self, link: _Link, now: float) -> None:
        if link.accepted_at is None:
            link.accepted_at = now
            if link.refusal is not None:
                self.pending_log.append(
                    ("info", f"link {link.link_id}: accepted {link.claim_id!r}")
                )
            link.refusal = None

    def _refuse(self, link: _Link, reason: str, level: str) -> None:
        link.accepted_at = None
        if link.refusal != reason:
            link.refusal = reason
            self.pending_log.append((level, f"link {link.link_id} refused: {reason}"))

    def _duplicate(self, router_id: str, text: str) -> None:
        if router_id not in self.duplicate_ids:
            self.duplicate_ids.add(router_id)
            self.pending_log.append(("error", f"duplicate router id: {text}"))
