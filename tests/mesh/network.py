"""In-process mesh simulator: RoutingEngines wired through mock data planes, on a fake clock.

Messages are deep-copied and checked to be plain AMQP-encodable maps, delivered in order per
connection after the connection's delay, and may be dropped by a per-connection predicate.
Every engine ticks every `tick` seconds of simulated time. Nothing sleeps: `run(10)` simulates
ten seconds in a few milliseconds.

`MockDataPlane` keeps the tables the engine pushes and fails the test on a call that changes
nothing (the engine must push only differences) or that breaks the ordering rules (an address
pushed for a router with no route).
"""

from __future__ import annotations

import copy
import heapq
import itertools
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from qrouter.mesh import RoutingEngine

Drop = Callable[[str, dict[str, Any]], bool]  # (sending router, message) -> drop it?


def check_encodable(value: Any, where: str = "message") -> None:
    """Only what maps onto AMQP types without a schema: str, int, list, str-keyed dict."""
    if isinstance(value, bool) or not isinstance(value, str | int | list | dict):
        raise AssertionError(f"{where}: {type(value).__name__} is not a plain AMQP value")
    if isinstance(value, list):
        for i, item in enumerate(value):
            check_encodable(item, f"{where}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            assert isinstance(key, str), f"{where}: key {key!r} is not a string"
            check_encodable(item, f"{where}.{key}")


class MockDataPlane:
    def __init__(self, network: Network | None, router_id: str) -> None:
        self.network = network
        self.router_id = router_id
        self.next_hop: dict[str, int] = {}
        self.cost: dict[str, int] = {}
        self.valid_origins: dict[str, list[str]] = {}
        self.remote: dict[str, set[str]] = {}  # address -> routers
        self.lost: list[str] = []
        self.logs: list[tuple[str, str]] = []
        self.sent: Counter[str] = Counter()  # op -> count
        self.table_calls = 0  # calls that change the forwarding tables
        self.outbox: list[tuple[int, dict[str, Any]]] = []  # with no network: what was sent

    def send(self, link_id: int, message: dict[str, Any]) -> None:
        check_encodable(message)
        self.sent[message["op"]] += 1
        if self.network is None:
            self.outbox.append((link_id, copy.deepcopy(message)))
        else:
            self.network.transmit(self.router_id, link_id, copy.deepcopy(message))

    def set_next_hop(self, router_id: str, link_id: int | None) -> None:
        self.table_calls += 1
        assert self.next_hop.get(router_id) != link_id, f"redundant next hop {router_id}"
        if link_id is None:
            assert not any(router_id in r for r in self.remote.values()), "route before address"
            del self.next_hop[router_id]
        else:
            self.next_hop[router_id] = link_id

    def set_cost(self, router_id: str, cost: int | None) -> None:
        self.table_calls += 1
        assert self.cost.get(router_id) != cost, f"redundant cost {router_id}"
        if cost is None:
            del self.cost[router_id]
        else:
            self.cost[router_id] = cost

    def set_valid_origins(self, router_id: str, origins: list[str]) -> None:
        self.table_calls += 1
        assert self.valid_origins.get(router_id, []) != origins, "redundant valid origins"
        assert router_id in self.next_hop, "valid origins for a router with no route"
        self.valid_origins[router_id] = list(origins)
        if not origins:
            del self.valid_origins[router_id]

    def add_remote_address(self, address: str, router_id: str) -> None:
        self.table_calls += 1
        assert router_id in self.next_hop, f"address {address} for unroutable {router_id}"
        routers = self.remote.setdefault(address, set())
        assert router_id not in routers, f"redundant add {address}@{router_id}"
        routers.add(router_id)

    def del_remote_address(self, address: str, router_id: str) -> None:
        self.table_calls += 1
        routers = self.remote.get(address, set())
        assert router_id in routers, f"del of unknown {address}@{router_id}"
        routers.discard(router_id)
        if not routers:
            del self.remote[address]

    def router_lost(self, router_id: str) -> None:
        self.lost.append(router_id)

    def log(self, level: str, msg: str) -> None:
        self.logs.append((level, msg))

    def errors(self) -> list[str]:
        return [msg for level, msg in self.logs if level == "error"]


@dataclass
class Connection:
    """One inter-router connection; each end has its own link id, as a real router would."""

    a: str
    b: str
    a_link: int
    b_link: int
    delay: float
    up: bool = True
    cut: bool = False  # silently lose everything, neither end is told
    drop: Drop | None = None

    def other(self, router_id: str) -> tuple[str, int]:
        return (self.b, self.b_link) if router_id == self.a else (self.a, self.a_link)


@dataclass
class Router:
    engine: RoutingEngine
    dp: MockDataPlane
    alive: bool = True
    links: dict[int, Connection] = field(default_factory=dict)


class Network:
    def __init__(self, *, tick: float = 0.1, delay: float = 0.005, **engine_args: float) -> None:
        self.now = 0.0
        self.tick_interval = tick
        self.delay = delay
        self.engine_args = engine_args
        self.routers: dict[str, Router] = {}
        self.connections: list[Connection] = []
        self._queue: list[tuple[float, int, str, int, dict[str, Any]]] = []
        self._order = itertools.count()
        self._link_ids = itertools.count(100)  # distinct per end, never 0 or 1
        self._next_tick = 0.0
        self.delivered = 0

    # -- building ----------------------------------------------------------------------------

    def add(
        self, router_id: str, instance: int = 1, *, name: str | None = None, **overrides: float
    ) -> RoutingEngine:
        """Add a router; `name` (default: its id) is the simulator's handle, so two routers
        may be given the same id to test duplicate detection."""
        name = name or router_id
        dp = MockDataPlane(self, name)
        args = self.engine_args | overrides
        engine = RoutingEngine(router_id, dp, instance=instance, **args)  # type: ignore[arg-type]
        self.routers[name] = Router(engine, dp)
        return engine

    def connect(
        self,
        a: str,
        b: str,
        cost: int = 1,
        cost_back: int | None = None,
        delay: float | None = None,
    ) -> Connection:
        conn = Connection(a, b, next(self._link_ids), next(self._link_ids), delay or self.delay)
        self.connections.append(conn)
        self.routers[a].links[conn.a_link] = conn
        self.routers[b].links[conn.b_link] = conn
        self.routers[a].engine.link_up(conn.a_link, cost)
        self.routers[b].engine.link_up(conn.b_link, cost if cost_back is None else cost_back)
        return conn

    def connection(self, a: str, b: str) -> Connection:
        for conn in self.connections:
            if conn.up and {conn.a, conn.b} == {a, b}:
                return conn
        raise KeyError((a, b))

    def disconnect(self, a: str, b: str) -> None:
        """Close the connection: both ends see link_down (a TCP close)."""
        conn = self.connection(a, b)
        conn.up = False
        for router_id, link_id in ((conn.a, conn.a_link), (conn.b, conn.b_link)):
            if self.routers[router_id].alive:
                self.routers[router_id].engine.link_down(link_id)

    def kill(self, router_id: str) -> None:
        """SIGKILL with the TCP connections left half-open: the peers are told nothing."""
        self.routers[router_id].alive = False
        for conn in self.routers[router_id].links.values():
            conn.cut = True

    def restart(self, router_id: str, instance: int, *, close_old: bool = True) -> RoutingEngine:
        """Start a new process with the same id and reconnect it to its old neighbours.

        close_old=False: the peers are not told the old connections closed (they only stop
        hearing on them), as when the new process connects before the old TCP close is seen.
        """
        old = self.routers[router_id]
        peers = []
        for conn in old.links.values():
            if conn.up:
                peer, peer_link = conn.other(router_id)
                peers.append(peer)
                conn.cut = True
                if close_old:
                    conn.up = False
                    if self.routers[peer].alive:
                        self.routers[peer].engine.link_down(peer_link)
        engine = self.add(router_id, instance)
        for peer in peers:
            self.connect(router_id, peer)
        return engine

    # -- running -----------------------------------------------------------------------------

    def transmit(self, sender: str, link_id: int, message: dict[str, Any]) -> None:
        conn = self.routers[sender].links[link_id]
        if not conn.up or conn.cut or (conn.drop is not None and conn.drop(sender, message)):
            return
        receiver, receiver_link = conn.other(sender)
        when = self.now + conn.delay
        heapq.heappush(self._queue, (when, next(self._order), receiver, receiver_link, message))

    def run(self, seconds: float) -> None:
        self._run_to(self.now + seconds)

    def run_until(self, done: Callable[[], bool], timeout: float) -> float:
        """Run until `done()` holds; return the simulated time it took."""
        start = self.now
        while not done():
            if self.now - start > timeout:
                raise AssertionError(f"not reached within {timeout} s of simulated time")
            self._step()
        return self.now - start

    def _run_to(self, end: float) -> None:
        while True:
            upcoming = min(self._next_tick, self._queue[0][0] if self._queue else end)
            if upcoming > end:
                break
            self._step()
        self.now = end

    def _step(self) -> None:
        # Messages due at or before the next tick go first, so a tick sees everything that
        # arrived by its time (what a real event loop does too).
        if self._queue and self._queue[0][0] <= self._next_tick:
            when, _, receiver, link_id, message = heapq.heappop(self._queue)
            self.now = when
            router = self.routers[receiver]
            conn = router.links.get(link_id)
            if router.alive and conn is not None and conn.up and not conn.cut:
                self.delivered += 1
                router.engine.receive(link_id, message, when)
            return
        self.now = self._next_tick
        self._next_tick = round(self._next_tick + self.tick_interval, 9)
        for router in self.routers.values():
            if router.alive:
                router.engine.tick(self.now)

    # -- looking -----------------------------------------------------------------------------

    def engine(self, router_id: str) -> RoutingEngine:
        return self.routers[router_id].engine

    def dp(self, router_id: str) -> MockDataPlane:
        return self.routers[router_id].dp

    def peer_of(self, router_id: str, link_id: int) -> str:
        return self.routers[router_id].links[link_id].other(router_id)[0]

    def via(self, router_id: str) -> dict[str, str]:
        """The data plane's view: destination -> router at the end of the next-hop link."""
        dp = self.dp(router_id)
        return {dest: self.peer_of(router_id, link) for dest, link in dp.next_hop.items()}

    def alive(self) -> list[str]:
        return [rid for rid, router in self.routers.items() if router.alive]

    def multicast(self, origin: str, address: str) -> Counter[str]:
        """Forward one multicast message from `origin` with the pushed tables, as the data
        plane does (docs/mesh.md, "Valid origins"); return how many copies each router got."""
        received: Counter[str] = Counter({origin: 1})
        pending = deque([origin])
        while pending:
            here = pending.popleft()
            dp = self.dp(here)
            links = set()  # one copy per next-hop connection, however many routers behind it
            for dest in dp.remote.get(address, ()):
                if here == origin or origin in dp.valid_origins.get(dest, []):
                    links.add(dp.next_hop[dest])
            for link in sorted(links):
                there = self.peer_of(here, link)
                received[there] += 1
                assert received[there] <= 1, f"{there} got a second copy from {origin}"
                pending.append(there)
        return received
