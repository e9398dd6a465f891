"""The routing engine: hello, link state, paths and mobile addresses behind one object.

Single-threaded and passive: the owner feeds it events (`link_up`, `link_down`, `receive`,
`tick`, local address changes) with the current monotonic time, and it answers through the
`DataPlane` it was given. It never sleeps, reads a clock (except for a default instance) or
touches a socket, so tests drive a whole mesh in memory with a fake clock (tests/mesh/).

What happens when (docs/mesh.md has the bounds):

* HELLO each hello_interval per link; a neighbour silent for hello_max_age is dropped.
* Our link state changes only when an adjacency appears, goes or changes cost; the new LSU is
  flooded at once. Received LSUs / MAUs / RAs that are new to us are flooded on at once, to
  every neighbour but the one they came from; sequence numbers stop the flood.
* An RA each ra_interval lets routers that missed an update notice (LSR / MAR) and keeps each
  record alive; a record not refreshed for remote_ls_max_age is dropped.
* Routes are recomputed after any event that changed the link-state database, and only the
  differences reach the data plane (tables.py).
"""

from __future__ import annotations

import time
from typing import Any

from qrouter.mesh.data_plane import DataPlane
from qrouter.mesh.hello import Adjacency, HelloProtocol
from qrouter.mesh.link_state import LinkStateDB, Verdict
from qrouter.mesh.messages import (
    Hello,
    LinkStateRequest,
    LinkStateUpdate,
    Message,
    MobileRequest,
    MobileUpdate,
    ProtocolError,
    RouterAdvert,
    decode,
)
from qrouter.mesh.mobile import MobileAddresses, Outcome
from qrouter.mesh.path import Routes, compute_routes
from qrouter.mesh.tables import ForwardingTables, Route

_MAX_SEQ = 2**62  # above it we do not outbid a forged sequence number (ours stays an AMQP long)


class RoutingEngine:
    def __init__(
        self,
        router_id: str,
        data_plane: DataPlane,
        *,
        hello_interval: float = 1.0,
        hello_max_age: float = 3.0,
        ra_interval: float = 30.0,
        remote_ls_max_age: float = 60.0,
        instance: int | None = None,
    ) -> None:
        if not 0 < hello_interval < hello_max_age:
            raise ValueError("need 0 < hello_interval < hello_max_age")
        if not 0 < ra_interval < remote_ls_max_age:
            raise ValueError("need 0 < ra_interval < remote_ls_max_age")
        self.router_id = router_id
        # Process start time in ms: a restart gets a larger instance, which is how every other
        # router knows to drop the old sequence numbers instead of waiting for them to age.
        self.instance = time.time_ns() // 1_000_000 if instance is None else instance
        self.ra_interval = ra_interval
        self.remote_ls_max_age = remote_ls_max_age
        self._dp = data_plane
        self._hello = HelloProtocol(router_id, self.instance, hello_interval, hello_max_age)
        self._ls = LinkStateDB(router_id, self.instance)
        self._mobile = MobileAddresses(router_id, self.instance)
        self._tables = ForwardingTables(data_plane)
        self._adjacent: dict[str, Adjacency] = {}
        self._routes = Routes({}, {}, {})
        self._dirty = False  # link-state database changed since the last route computation
        self._ra_seq = 0
        self._next_ra: float | None = None
        self._now = 0.0
        self._duplicates: set[str] = set()
        self._behind: dict[int, frozenset[str]] = {}  # link -> routers behind it (cache)
        self.refused_origins = 0  # address updates whose origin is not behind their link
        self.refused_link_states = 0  # a neighbour's link state not from it; forged own states

    # -- events from the data plane ----------------------------------------------------------

    def link_up(self, link_id: int, cost: int = 1) -> None:
        if cost < 1:
            raise ValueError("link cost must be at least 1")
        if self._hello.is_up(link_id):
            self.link_down(link_id)
        self._send(link_id, self._hello.link_up(link_id, cost))

    def link_down(self, link_id: int) -> None:
        if not self._hello.is_up(link_id):
            return
        self._hello.link_down(link_id, self._now)
        self._adjacency_changed(self._now)
        self._update_routes()

    def receive(self, link_id: int, message: dict[str, Any], now: float) -> None:
        self._now = now
        if not self._hello.is_up(link_id):
            self._log("debug", f"link {link_id}: message on a link that is not up, dropped")
            return
        try:
            msg = decode(message)
        except ProtocolError as exc:
            self._log("warning", f"link {link_id}: bad control message dropped: {exc}")
            return
        if isinstance(msg, Hello):
            reply = self._hello.receive(link_id, msg, now)
            if reply is not None:
                self._send(link_id, reply)
            self._adjacency_changed(now)
        elif not self._hello.accepts(link_id):
            # Refused (duplicate id) or not introduced by a HELLO yet: nothing it says is used.
            self._log("debug", f"link {link_id}: {msg.OP} from an unaccepted peer dropped")
        else:
            self._dispatch(link_id, msg, now)
        self._update_routes()

    def tick(self, now: float) -> None:
        self._now = now
        self._hello.expire(now)
        self._adjacency_changed(now)
        for link_id, hello in self._hello.due(now):
            self._send(link_id, hello)
        if self._next_ra is None:
            self._next_ra = now + self.ra_interval
        elif now >= self._next_ra:
            self._next_ra = now + self.ra_interval
            self._ra_seq += 1
            self._flood(self._advert())
        for router_id in self._ls.expire(now, self.remote_ls_max_age):
            self._log("info", f"router {router_id!r} aged out: no word from it in time")
            self._mobile.forget(router_id)
            self._tables.sync_addresses(router_id, set())
            self._dirty = True
        self._update_routes()

    def next_due(self) -> float:
        """The earliest time at which `tick` has work (-inf: at once): a HELLO to send or a
        neighbour to age out, the next RA, a router's link state to age out. Between such
        times `tick` changes nothing, so a data plane may tick then (and after any event it
        passed in) instead of at a fixed period; `tick` stays safe to call at any time."""
        if self._dirty or self._hello.pending_log or self._next_ra is None:
            return float("-inf")
        return min(
            self._hello.next_due(),
            self._next_ra,
            self._ls.next_expiry(self.remote_ls_max_age),
        )

    def local_address_added(self, address: str) -> None:
        update = self._mobile.add_local(address)
        if update is not None:
            self._flood(update)

    def local_address_removed(self, address: str) -> None:
        update = self._mobile.remove_local(address)
        if update is not None:
            self._flood(update)

    # -- introspection (management, tests) ---------------------------------------------------

    def neighbours(self) -> dict[str, int]:
        """Adjacent routers (two-way) and the connection used for each."""
        return {router_id: adj.link_id for router_id, adj in self._adjacent.items()}

    def topology(self) -> dict[str, dict[str, int]]:
        """Link-state database: router -> {neighbour: cost}, as each router advertises it."""
        return {rid: dict(peers) for rid, peers in self._ls.link_states().items()}

    def next_hops(self) -> dict[str, str]:
        """Reachable router -> the neighbour its traffic goes through."""
        return dict(self._routes.next_hop)

    def costs(self) -> dict[str, int]:
        return dict(self._routes.cost)

    def valid_origins(self) -> dict[str, list[str]]:
        return {rid: list(origins) for rid, origins in self._routes.valid_origins.items()}

    def addresses(self) -> dict[str, set[str]]:
        """Address -> routers with consumers for it (this one and every reachable one)."""
        found: dict[str, set[str]] = {}
        for router_id in [self.router_id, *self._tables.routes]:
            for address in self._mobile.addresses_of(router_id):
                found.setdefault(address, set()).add(router_id)
        return found

    @property
    def duplicate_ids(self) -> set[str]:
        """Router ids seen in use by more than one live router instance."""
        return self._duplicates | self._hello.duplicate_ids

    def refused_links(self) -> dict[int, str]:
        """Links whose peer is refused (duplicate id), with the reason; the owner may close them."""
        return self._hello.refused_links()

    # -- protocol ----------------------------------------------------------------------------

    def _dispatch(self, link_id: int, msg: Message, now: float) -> None:
        if isinstance(msg, LinkStateRequest | MobileRequest):
            answer = self._answer(msg)
            if answer is not None:
                self._send(link_id, answer)
            return
        assert not isinstance(msg, Hello)
        if msg.id == self.router_id:
            self._own_echo(msg)
        elif isinstance(msg, LinkStateUpdate) and not self._from_its_origin(link_id, msg):
            pass  # a neighbour's link state relayed by another: dropped and counted
        elif not self._admit(msg.id, msg.instance, now):
            if isinstance(msg, RouterAdvert) and self._ls.old_instance_advertising(
                msg.id, msg.instance, msg.ra_seq
            ):
                newer = self._ls.remote[msg.id].instance
                self._duplicate(msg.id, f"instance {msg.instance} still advertises beside {newer}")
        elif isinstance(msg, RouterAdvert):
            self._on_advert(link_id, msg, now)
        elif isinstance(msg, LinkStateUpdate):
            if self._ls.accept(msg, now):
                self._flood(msg, but=link_id)
                self._dirty = True
        elif not self.behind(link_id, msg.id):
            # an address update that claims a router the link does not lead to
            self.refused_origins += 1
            if self.refused_origins <= 10 or self.refused_origins % 1000 == 0:
                self._log(
                    "warning",
                    f"link {link_id}: {msg.OP} claims router {msg.id!r}, which is not behind "
                    f"it: dropped ({self.refused_origins} so far)",
                )
        else:
            self._on_mobile(link_id, msg, now)

    def behind(self, link_id: int, origin: str) -> bool:
        """Whether a message claiming `origin` may come in on `link_id`: `origin` is the
        neighbour there, or a router the link-state database reaches from that neighbour
        without passing through this router. (Not "the next hop to `origin` is that link":
        with equal-cost paths the two ends may pick different ones.)"""
        reach = self._behind.get(link_id)
        if reach is None:
            start = [rid for rid, adj in self._adjacent.items() if adj.link_id == link_id]
            graph = self._ls.link_states()
            seen = set(start)
            while start:
                for nxt in graph.get(start.pop(), {}):
                    if nxt != self.router_id and nxt not in seen:
                        seen.add(nxt)
                        start.append(nxt)
            reach = self._behind[link_id] = frozenset(seen)
        return origin in reach

    @property
    def behind_sets(self) -> dict[int, frozenset[str]]:
        """`behind`'s cache, link -> the routers behind it: one dict for the engine's life,
        emptied when the routes are recomputed. A compiled reader (qrouter/_fast/
        eo_control.pxi) looks its link up here and calls `behind` when it is missing."""
        return self._behind

    def _from_its_origin(self, link_id: int, update: LinkStateUpdate) -> bool:
        """A neighbour's link state is taken only from its own connection, whose router id
        the owner authenticated (qrouter/inter_router.py checks HELLO against OPEN); relayed
        copies of it are redundant, as every router sends its state to each neighbour
        itself. So a member cannot rewrite what the routers next to it say about their
        links. (Routes also use a link only when both ends list it: path.py two_way_graph.)"""
        adjacency = self._adjacent.get(update.id)
        if adjacency is None or self._hello.peer_on(link_id) == update.id:
            return True
        if update.instance != adjacency.instance:
            return True  # another process with that id: a restart or a duplicate (_admit)
        record = self._ls.remote.get(update.id)
        if record is not None and update.ls_seq <= record.ls_seq:
            return False  # the flood coming round: nothing we lack, nothing to tell
        self._refused_link_state(
            f"link {link_id}: link state of neighbour {update.id!r} relayed by "
            f"{self._hello.peer_on(link_id)!r}: dropped"
        )
        return False

    def _refused_link_state(self, text: str) -> None:
        self.refused_link_states += 1
        if self.refused_link_states <= 10 or self.refused_link_states % 1000 == 0:
            self._log("warning", f"{text} ({self.refused_link_states} so far)")

    def _on_advert(self, link_id: int, ra: RouterAdvert, now: float) -> None:
        record = self._ls.remote[ra.id]
        record.last_seen = now
        if ra.ra_seq <= record.ra_seq:
            return  # a copy that came round another way
        record.ra_seq = ra.ra_seq
        self._flood(ra, but=link_id)
        # Ask the neighbour that passed the RA on: it has applied everything the originator
        # sent before this RA (links deliver in order), so it can answer from its own copy.
        if ra.ls_seq > record.ls_seq:
            self._send(link_id, LinkStateRequest(self.router_id, ra.id))
        if ra.mobile_seq > self._mobile.seq(ra.id):
            self._send(link_id, MobileRequest(self.router_id, ra.id))

    def _on_mobile(self, link_id: int, update: MobileUpdate, now: float) -> None:
        self._ls.remote[update.id].last_seen = now
        outcome = self._mobile.apply(update)
        if outcome is Outcome.APPLIED:
            self._flood(update, but=link_id)
            if update.exist is None:
                self._tables.change_addresses(update.id, update.add, update.delete)
            else:
                self._tables.sync_addresses(update.id, self._mobile.addresses_of(update.id))
        elif outcome is Outcome.GAP:
            self._log(
                "debug",
                f"mobile seq gap for {update.id!r}: hold {self._mobile.seq(update.id)}, "
                f"got {update.mobile_seq}; asking link {link_id} for the full list",
            )
            self._send(link_id, MobileRequest(self.router_id, update.id))

    def _answer(self, request: LinkStateRequest | MobileRequest) -> Message | None:
        if isinstance(request, LinkStateRequest):
            return self._ls.update_for(request.target)
        if request.target == self.router_id:
            return self._mobile.full_update(self.router_id, self.instance)
        record = self._ls.remote.get(request.target)
        return self._mobile.full_update(request.target, record.instance) if record else None

    def _admit(self, router_id: str, instance: int, now: float) -> bool:
        """Check the originator's instance; reset what we hold if it restarted."""
        verdict = self._ls.observe(router_id, instance, now)
        if verdict is Verdict.RESTARTED:
            self._log("info", f"router {router_id!r} restarted (instance {instance})")
            self._mobile.forget(router_id)
            self._tables.sync_addresses(router_id, set())
            if router_id in self._tables.routes:
                # Deliveries sent to the old process will never be settled by the new one.
                self._dp.router_lost(router_id)
            self._dirty = True
        return verdict is not Verdict.STALE

    def _own_echo(self, msg: RouterAdvert | LinkStateUpdate | MobileUpdate) -> None:
        """A flooded message that names our id: our own copy, a leftover, or a duplicate."""
        if msg.instance == self.instance:
            own = self._ls.own
            if isinstance(msg, LinkStateUpdate) and (
                msg.ls_seq > own.ls_seq or (msg.ls_seq == own.ls_seq and dict(msg.ls) != own.peers)
            ):
                # Not ours: we never sent this sequence number (or not with these links). As
                # OSPF does with a self-originated LSA newer than its own (RFC 2328 13.4),
                # send our real state with a sequence number above the forged one.
                outbid = msg.ls_seq < _MAX_SEQ  # else counted only: ours must not near 2**63
                self._refused_link_state(
                    f"a link state in our name with seq {msg.ls_seq} (ours is {own.ls_seq}) "
                    "that we did not send: forged; "
                    + ("ours goes out above it" if outbid else "too high to outbid")
                )
                if outbid:
                    own.ls_seq = int(msg.ls_seq) + 1
                    self._flood(self._ls.update_for(self.router_id))  # type: ignore[arg-type]
            return  # otherwise our own message came back round a loop
        if msg.instance > self.instance or (
            isinstance(msg, RouterAdvert)
            and self._ls.old_instance_advertising(self.router_id, msg.instance, msg.ra_seq)
        ):
            # Leftovers of our previous process stop within a flood time; a newer instance, or
            # an older one that keeps advertising, is another live router using our id.
            self._duplicate(self.router_id, f"instance {msg.instance} also advertises our id")

    def _duplicate(self, router_id: str, detail: str) -> None:
        if router_id not in self.duplicate_ids:
            self._duplicates.add(router_id)
            self._log("error", f"duplicate router id {router_id!r}: {detail}")

    def _adjacency_changed(self, now: float) -> None:
        for level, text in self._hello.pending_log:
            self._log(level, text)
        self._hello.pending_log.clear()
        current = self._hello.adjacencies()
        previous, self._adjacent = self._adjacent, current
        if current == previous:
            return
        self._dirty = True  # even a switch between parallel links changes the next-hop link
        lost = sorted(set(previous) - set(current))
        for router_id in lost:
            self._log("info", f"neighbour {router_id!r} lost")
        fresh = []
        for router_id, adj in sorted(current.items()):
            old = previous.get(router_id)
            if old is not None and old.instance == adj.instance:
                continue
            if not self._admit(router_id, adj.instance, now):
                self._duplicate(router_id, f"neighbour instance {adj.instance} is not the newest")
            self._log("info", f"neighbour {router_id!r} up on link {adj.link_id}")
            fresh.append(router_id)
        changed = self._ls.set_own_peers({rid: adj.cost for rid, adj in current.items()})
        for router_id in fresh:
            self._sync(current[router_id].link_id)
        if changed:
            own = self._ls.update_for(self.router_id)
            assert own is not None
            for router_id, adj in current.items():
                if router_id not in fresh:
                    self._send(adj.link_id, own)
        self._update_routes()
        for router_id in lost:
            if router_id in self._tables.routes:
                # Still reachable another way, but what was sent over the old connection
                # will not be settled through it.
                self._dp.router_lost(router_id)

    def _sync(self, link_id: int) -> None:
        """Give a new neighbour our whole database: our state and every reachable router's.

        Unreachable records are left out so a dead router's state is not given a fresh age
        elsewhere (each router ages records by when it received them).
        """
        routers = [self.router_id, *sorted(self._tables.routes)]
        for router_id in routers:
            update = self._ls.update_for(router_id)
            if update is not None:
                self._send(link_id, update)
        for router_id in routers:
            instance = self.instance if router_id == self.router_id else None
            if instance is None:
                record = self._ls.remote.get(router_id)
                instance = record.instance if record else None
            full = self._mobile.full_update(router_id, instance) if instance else None
            if full is not None:
                self._send(link_id, full)

    def _update_routes(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        self._behind.clear()
        routes = compute_routes(self.router_id, self._ls.link_states())
        table: dict[str, Route] = {}
        for router_id, neighbour in routes.next_hop.items():
            # Our own link state lists exactly our adjacencies, so the first hop is one of them.
            adj = self._adjacent[neighbour]
            table[router_id] = Route(
                adj.link_id, routes.cost[router_id], routes.valid_origins[router_id]
            )
        before = set(self._tables.routes)
        self._tables.apply_routes(table, self._mobile.addresses_of)
        self._routes = routes
        for router_id in sorted(before - set(table)):
            self._log("info", f"router {router_id!r} unreachable")
        for router_id in sorted(set(table) - before):
            self._log("info", f"router {router_id!r} reachable via {routes.next_hop[router_id]!r}")

    def _advert(self) -> RouterAdvert:
        return RouterAdvert(
            self.router_id, self.instance, self._ra_seq, self._ls.own.ls_seq, self._mobile.local_seq
        )

    def _flood(self, msg: Message, but: int | None = None) -> None:
        for adj in self._adjacent.values():
            if adj.link_id != but:
                self._send(adj.link_id, msg)

    def _send(self, link_id: int, msg: Message) -> None:
        self._dp.send(link_id, msg.to_wire())

    def _log(self, level: str, text: str) -> None:
        self._dp.log(level, f"[mesh {self.router_id}] {text}")
