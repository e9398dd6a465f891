"""The link registry (DESIGN.md §5; the seed link-registry-design.txt, after Qpid Broker-J).

A terminus is keyed by (local container-id, remote container-id, link name, role); the role is
the router's end of the link ("sender" when the router sends, i.e. the peer consumes). The
registry enforces one attachment per key (a second attach steals the link: the older one is
detached with amqp:link:stolen), keeps a suspended terminus as its expiry policy says
(3.5.6 terminus-expiry-policy, with its timeout counted from suspension, also across a
restart), gives a stored terminus back to an ATTACH with a null source/target (the
durable-subscription pattern), and grants terminus durability (3.5.5) up to what the store can
honour.

Called on attach and detach only: never per message.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger("qrouter.links")

Key = tuple[str, str, str, str]

# 3.5.6 terminus-expiry-policy, in the order of the events that trigger them: a policy
# triggers on its own event and on every later (broader) one.
EXPIRY_POLICIES = ("link-detach", "session-end", "connection-close", "never")
DEFAULT_EXPIRY = "session-end"  # 3.5.3 / 3.5.4: the default of source and target


@dataclass(slots=True)  # one per attached link: kept small
class Terminus:
    """The router's terminus of one link: its source (router sends) or target (router
    receives), and the state the registry keeps for it."""

    key: Key
    address: str | None
    fields: dict[str, Any]  # the terminus as plain values (address, filter, capabilities ...)
    durable: int = 0  # granted terminus durability: 0 none, 1 configuration, 2 unsettled-state
    expiry_policy: str = DEFAULT_EXPIRY
    timeout: float = 0.0  # seconds the terminus survives once its expiry policy triggered
    suspended_at: float | None = None  # wall-clock seconds; None while attached
    expires: bool = False  # the expiry policy has triggered (the timeout runs)
    link: Any = None  # the attached engine Link, or None
    # durability 2: deliveries held while the link is away (tag -> engine Delivery), and the
    # store's records of them as loaded after a restart (record id -> UnsettledRecord; the
    # id is the tag unless the record carries the tag, qrouter/stores/termini.py)
    held: dict[bytes, Any] = field(default_factory=dict)
    records: dict[bytes, Any] = field(default_factory=dict)

    @property
    def role(self) -> str:
        return self.key[3]

    @property
    def attached(self) -> bool:
        return self.link is not None

    def expiry_deadline(self) -> float | None:
        if not self.expires or self.suspended_at is None:
            return None
        return self.suspended_at + self.timeout


class TerminusPersistence(Protocol):
    """Where termini of durability >= 1 are kept (the store layer)."""

    durability: int

    def save(self, terminus: Terminus) -> None: ...

    def delete(self, key: Key) -> None: ...

    def load(self) -> Iterable[Terminus]: ...


class NoPersistence:
    """The memory store: nothing survives a restart (durability 0 across restarts)."""

    durability = 0

    def save(self, terminus: Terminus) -> None:
        pass

    def delete(self, key: Key) -> None:
        pass

    def load(self) -> Iterable[Terminus]:
        return ()


class AttachError(Exception):
    """An ATTACH the registry refuses: detach the link with this condition."""

    def __init__(self, condition: str, description: str) -> None:
        super().__init__(f"{condition}: {description}")
        self.condition = condition
        self.description = description


class LinkRegistry:
    def __init__(
        self,
        container_id: str,
        persistence: TerminusPersistence | None = None,
        *,
        clock: Callable[[], float] = time.time,
        max_name: int = 1024,
        max_durability: int = 2,
        on_discard: Callable[[Terminus], None] | None = None,
        limits: Any = None,
    ) -> None:
        self.container_id = container_id
        self.persistence: TerminusPersistence = persistence or NoPersistence()
        self.clock = clock
        self.max_name = max_name
        self.max_durability = max_durability
        # told when a terminus goes for good, so what it held can be settled
        self.on_discard = on_discard
        self.termini: dict[Key, Terminus] = {}
        # qrouter/limits.py: termini per container and in total, timeout cap, expiry never
        self.limits = limits
        self.per_container: Counter[str] = Counter()  # registered termini by remote container
        self.by_link: dict[Any, Terminus] = {}
        # volatile links (not registered as termini): (key, connection) -> link, and back
        self.volatile: dict[tuple[Key, int], Any] = {}
        self.volatile_key: dict[Any, tuple[Key, int]] = {}
        self.volatile_termini: dict[Any, Terminus] = {}

    # -- restart ---------------------------------------------------------------------------

    def recover(self, crashed_at: float | None = None) -> int:
        """Load stored termini after a restart. One that was attached when the router
        stopped counts as suspended since `crashed_at` (the last time the router was known
        alive), with its expiry policy triggered by the connection loss."""
        count = 0
        now = self.clock()
        died = crashed_at if crashed_at is not None else now
        for t in self.persistence.load():
            # every connection is gone after a restart, so every policy but "never" has
            # triggered: at suspension for link-detach, by the crash at the latest for the
            # broader ones (whose trigger may have come only with the crash)
            if t.suspended_at is None or t.expiry_policy != "link-detach":
                t.suspended_at = max(t.suspended_at or died, died)
            t.expires = t.expiry_policy != "never"
            t.link = None
            if t.key not in self.termini:
                self.per_container[t.key[1]] += 1
            self.termini[t.key] = t
            count += 1
        self.expire()
        return count

    # -- attach ------------------------------------------------------------------------------

    def key_for(self, remote_container: str, name: str, router_sends: bool) -> Key:
        self._check_name("container-id", remote_container)
        self._check_name("link name", name)
        return (self.container_id, remote_container, name, "sender" if router_sends else "receiver")

    def _check_name(self, what: str, value: Any) -> None:
        if not isinstance(value, str) or not value:
            raise AttachError("amqp:invalid-field", f"{what} must be a non-empty string")
        if len(value) > self.max_name:
            raise AttachError(
                "amqp:invalid-field", f"{what} longer than {self.max_name} characters"
            )
        if any(ord(c) < 0x20 for c in value):
            raise AttachError("amqp:invalid-field", f"{what} contains control characters")

    def attach(
        self, key: Key, link: Any, peer_terminus: dict[str, Any] | None, address: str | None
    ) -> Terminus:
        """Register `link` under `key`. `peer_terminus` is the router's terminus as the peer
        described it (its source when the router sends, its target when it receives), or None
        to recover the stored one. Returns the terminus to attach with; link stealing (the
        older attachment detached with amqp:link:stolen) happens here."""
        old = self.termini.get(key)
        if old is None and peer_terminus is not None and _volatile(peer_terminus):
            # a terminus not meant to outlive its link (durable 0, expiry other than never):
            # not registered, so clients on different connections that share a container-id
            # and link name (many load tools do) each keep their own link; on one connection
            # the name is still unique (2.6.1), and a second attach steals the first
            here = (key, id(getattr(link, "conn", None)))
            prev = self.volatile.get(here)
            if prev is not None and prev is not link:
                self.volatile_key.pop(prev, None)
                self.volatile_termini.pop(prev, None)
                try:
                    prev.detach("amqp:link:stolen", "the link was attached again", closed=False)
                except Exception:
                    log.exception("detaching a stolen link failed")
            self.volatile[here] = link
            self.volatile_key[link] = here
            t = Terminus(
                key=key,
                address=address,
                fields=peer_terminus,
                expiry_policy=str(peer_terminus.get("expiry_policy") or DEFAULT_EXPIRY),
                link=link,
            )
            self.volatile_termini[link] = t
            return t
        if not getattr(self.persistence, "available", True) and (
            peer_terminus is None
            or (old is not None and old.durable >= 1)
            or min(_int(peer_terminus.get("durable"), 0), self.max_durability) >= 1
        ):
            # a store commit is failing (qrouter/store_health.py): no new durable work
            raise AttachError("amqp:resource-limit-exceeded", "store unavailable")
        if old is not None and old.link is not None and old.link is not link:
            self._steal(old)
        if peer_terminus is None:
            # recovery: an ATTACH with a null source/target gets the stored terminus back
            if old is None:
                raise AttachError("amqp:not-found", f"no terminus to recover for link '{key[2]}'")
            t = old
        else:
            requested = _int(peer_terminus.get("durable"), 0)
            policy = str(peer_terminus.get("expiry_policy") or DEFAULT_EXPIRY)
            if policy not in EXPIRY_POLICIES:
                raise AttachError("amqp:invalid-field", f"unknown expiry-policy '{policy}'")
            timeout = float(_int(peer_terminus.get("timeout"), 0))
            if self.limits is not None:
                # 3.5.3: the router's ATTACH states the policy and timeout it grants
                policy, timeout = self.limits.expiry(policy, timeout)
                if old is None or old.address != address:
                    self.limits.check_new_terminus(
                        key[1],
                        self.per_container[key[1]] - (old is not None),
                        len(self.termini) - (old is not None),
                    )
            granted = max(0, min(requested, self.max_durability, self.persistence.durability))
            if old is not None and old.address == address:
                t = old  # the same terminus, resumed: its unsettled state stays
                t.fields = dict(peer_terminus)
            else:
                if old is not None:
                    self._destroy(old)  # another address: a new terminus, nothing resumes
                t = Terminus(key=key, address=address, fields=dict(peer_terminus))
            t.durable = granted
            t.expiry_policy = policy
            t.timeout = timeout
        t.link = link
        t.suspended_at = None
        t.expires = False
        if key not in self.termini:
            self.per_container[key[1]] += 1
        self.termini[key] = t
        self.by_link[link] = t
        try:
            if t.durable >= 1:
                self.persistence.save(t)
            elif old is not None and old.durable >= 1:
                self.persistence.delete(key)
        except Exception as exc:  # the store failed (qrouter/store_health.py said so)
            self.by_link.pop(link, None)
            t.link = None
            t.suspended_at = self.clock()
            if old is None:
                self.termini.pop(key, None)
            raise AttachError("amqp:resource-limit-exceeded", "store unavailable") from exc
        return t

    def _steal(self, old: Terminus) -> None:
        link = old.link
        self.by_link.pop(link, None)
        old.link = None
        log.info("link %r stolen from an earlier attachment", old.key[2])
        try:
            link.detach(
                "amqp:link:stolen",
                "the link was attached again on another connection",
                closed=False,
            )
        except Exception:  # the old connection may be closing: the new attach goes on
            log.exception("detaching a stolen link failed")

    # -- detach and expiry ----------------------------------------------------------------

    def detached(self, link: Any, closed: bool, cause: str) -> Terminus | None:
        """The link went away: `closed` (the peer or we closed it: the terminus goes), or
        suspended by `cause` ("link-detach", "session-end" or "connection-close")."""
        t = self.by_link.pop(link, None)
        here = self.volatile_key.pop(link, None)
        if here is not None:
            self.volatile_termini.pop(link, None)
            if self.volatile.get(here) is link:
                del self.volatile[here]
            return None
        if t is None or t.link is not link:
            return None
        t.link = None
        if closed:
            self._destroy(t)
            return None
        t.suspended_at = self.clock()
        t.expires = _triggers(t.expiry_policy, cause)
        if t.expires and t.timeout <= 0:
            self._destroy(t)
            return None
        if t.durable >= 1:
            try:
                self.persistence.save(t)
            except Exception:  # the store failed: said and retried (qrouter/store_health.py)
                log.debug("terminus of link %r: suspension not stored", t.key[2])
        return t

    def expire(self, now: float | None = None) -> list[Terminus]:
        """Discard suspended termini whose expiry timeout has passed; call about once a
        second."""
        now = self.clock() if now is None else now
        gone = [
            t
            for t in self.termini.values()
            if t.link is None and (d := t.expiry_deadline()) is not None and d <= now
        ]
        for t in gone:
            log.info("terminus of link %r expired", t.key[2])
            self._destroy(t)
        return gone

    def _destroy(self, t: Terminus) -> None:
        if self.termini.get(t.key) is t:
            del self.termini[t.key]
            self.per_container[t.key[1]] -= 1
            if self.per_container[t.key[1]] <= 0:
                del self.per_container[t.key[1]]
        if self.on_discard is not None and t.held:
            self.on_discard(t)
        if t.durable >= 1:
            try:
                self.persistence.delete(t.key)
            except Exception:  # the store failed: the record stays until it expires again
                log.warning("terminus of link %r: its store record could not go", t.key[2])

    # -- introspection ----------------------------------------------------------------------

    def get(self, key: Key) -> Terminus | None:
        return self.termini.get(key)

    def for_link(self, link: Any) -> Terminus | None:
        return self.by_link.get(link) or self.volatile_termini.get(link)

    def all(self) -> list[Terminus]:
        """Every terminus: registered ones (attached or suspended) and volatile attached ones."""
        return list(self.termini.values()) + list(self.volatile_termini.values())


def _volatile(peer_terminus: dict[str, Any]) -> bool:
    return _int(peer_terminus.get("durable"), 0) == 0 and peer_terminus.get("expiry_policy") != (
        "never"
    )


def _triggers(policy: str, cause: str) -> bool:
    """3.5.6: link-detach expires on any detach; session-end on session end or connection
    close; connection-close on connection close; never, never."""
    if policy == "never":
        return False
    return EXPIRY_POLICIES.index(cause) >= EXPIRY_POLICIES.index(policy)


def _int(value: Any, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except (TypeError, ValueError):
        return default
