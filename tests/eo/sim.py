"""Deterministic simulation of exactly-once pub/sub (FoundationDB style): one seed, one schedule.

One `random.Random(seed)` drives everything: the mesh size, client placement, delays, when
messages are published, when a subscriber's application processes what it received, and
the faults. A schedule has three phases:

1. *setup*: N routers (3 or 4) fully connected; every subscriber attaches once and the run
   waits until every router knows every subscriber. "Subscribed" is therefore exact: every
   subscriber is subscribed from its first attach (before the first publish) to the end (the
   simulation never detaches a link with closed=true).
2. *chaos*: publishers publish; faults strike at random — an inter-router channel breaks (what
   was in flight is lost; both ends told; it reconnects later), a router crashes (all its
   memory, channels and client connections are gone; its `MemoryRecordStore` keeps what was
   committed) and restarts later with a new instance, a client's connection drops and the
   client fails over to a random router; with `store_failures`, a router's store fails its
   commits for a while (fail-stop: the commit and every output after it wait, in order, for
   a retry; attaches are refused; a crash before the retry loses them). Messages on one
   channel or connection arrive in
   order; different channels interleave arbitrarily (delays are random, sometimes long).
3. *quiet*: no more faults; every router restarts, every channel reconnects, clients
   reconnect; the run goes on until everything drained (or a deadline).

Then `violations()` checks the invariant:

* every message a publisher published was accepted to it (after the resends it must do), and
  its unsettled map is empty;
* every subscriber's application processed each accepted message exactly once (at least once
  in at-least-once mode), and nothing twice;
* exactly-once: every subscriber's unsettled map is empty (it saw every settlement) and no
  router holds a record (every record was dropped).

Clients are modelled as real ones must be for exactly-once: the subscriber keeps, per delivery
tag, whether its application processed it, persisted atomically with the processing, and
reports that map when it re-attaches; the publisher keeps its unsettled map (tag -> message,
saw ACCEPTED) and uses a counter for tags.

Reproduce one schedule: ``python -m tests.eo.sim SEED`` (prints the trace), or
``QROUTER_EO_SEED=SEED pytest tests/eo -k seed``.
"""

from __future__ import annotations

import heapq
import itertools
import random
import sys
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from qrouter.eo import AT_LEAST_ONCE, EXACTLY_ONCE, AttId, MemoryRecordStore, Pub, Sub, TopicRouter
from qrouter.eo.messages import make

TICK = 0.25


@dataclass
class Params:
    mode: str = EXACTLY_ONCE
    unsafe: tuple[str, ...] = ()
    routers: tuple[int, int] = (3, 4)
    publishers: tuple[int, int] = (1, 2)
    subscribers: tuple[int, int] = (2, 3)
    messages: tuple[int, int] = (3, 6)  # per publisher
    window: int = 3  # publisher's unsettled deliveries at most
    chaos: float = 4.0  # seconds of faults
    fault_every: float = 0.5  # mean seconds between faults
    deadline: float = 60.0  # seconds of quiet before giving up
    terminus_timeout: float = 1e9
    close_share: float = 0.0  # of subscriber faults: close (closed=true), re-subscribe later
    lacking: tuple[int, int] = (0, 0)  # routers in the mesh without the topic's guarantee
    # each router's wall clock is off by up to this (s), either way: the attachment stamps
    # (view.py) must order a close and a re-attach even so, if the skew is below the time
    # the subscriber takes to attach again (close_sub: >= 0.05 s)
    clock_skew: float = 0.0
    # of faults: a router's store fails its commits for a while (fail-stop, as
    # qrouter/guarantee.py: the writes and every output after them are held, in order, and
    # attaches refused, until a retry commits them; a crash meanwhile loses them)
    store_failures: float = 0.0
    # of client connection faults: half-open (the client sees its connection gone; the
    # router only when the idle timeout passes). The client attaches again after
    # `failover_wait` (decision 6 of docs/exactly-once.md: 2 x idle timeout + a margin)
    half_open: float = 0.0
    idle_timeout: float = 0.3
    failover_wait: float = 0.7


CI_PARAMS = Params(
    chaos=8.0,
    messages=(4, 10),
    fault_every=0.3,
    publishers=(1, 3),
    subscribers=(2, 4),
    window=4,
    close_share=0.25,
    lacking=(0, 1),
    clock_skew=0.02,
)
"""What the CI tests run: heavier than the defaults (a fault every 0.3 s for 8 s)."""

STORE_PARAMS = Params(**{**CI_PARAMS.__dict__, "store_failures": 0.15, "half_open": 0.3})
"""CI_PARAMS with store failures and half-open connections too (other schedules than
CI_PARAMS' for the same seed)."""

# the modes the tests that check an invariant after every step run their schedules in, and
# their ids (pytest.mark.parametrize("params", CHECK_MODES, ids=CHECK_MODE_IDS))
CHECK_MODES = (
    CI_PARAMS,
    STORE_PARAMS,
    Params(**{**CI_PARAMS.__dict__, "mode": AT_LEAST_ONCE}),
    Params(**{**CI_PARAMS.__dict__, "unsafe": ("drop-on-settle",)}),
)
CHECK_MODE_IDS = ("exactly-once", "store-failures", "at-least-once", "drop-on-settle")


@dataclass
class Channel:
    a: str
    b: str
    up: bool = False
    gen: int = 0
    last: dict[str, float] = field(default_factory=dict)  # FIFO: last arrival per direction


@dataclass
class SimRouter:
    name: str
    store: MemoryRecordStore
    instance: int = 0
    tr: TopicRouter | None = None
    conns: dict[AttId | Pub, Conn] = field(default_factory=dict)
    failing_until: float = -1.0  # the store fails commits until then
    held: bool = False  # a commit failed: commits and outputs wait for a retry
    pending: list[tuple[dict[bytes, bytes], set[bytes]]] = field(default_factory=list)
    outbox: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)


class SimStore:
    """A router instance's store as qrouter/guarantee.py commits to it: a commit fails while
    the store is failing, and from then on every commit waits (in order) for the retry."""

    def __init__(self, sim: Simulation, router: SimRouter, instance: int) -> None:
        self.sim = sim
        self.r = router
        self.instance = instance

    def commit(self, puts: dict[bytes, bytes], deletes: set[bytes]) -> None:
        r = self.r
        if r.instance != self.instance:
            return
        if not r.held and self.sim.now < r.failing_until:
            r.held = True
            self.sim.note(f"{r.name} store commit FAILS: held until a retry")
            self.sim.after(
                self.sim.rng.uniform(0.05, 0.3), self.sim.retry_store, r.name, r.instance
            )
        if r.held:
            r.pending.append((dict(puts), set(deletes)))
        else:
            r.store.commit(puts, deletes)

    def scan(self, prefix: bytes) -> Iterable[tuple[bytes, bytes]]:
        return self.r.store.scan(prefix)


@dataclass
class Conn:
    """A client's connection to one router (one link on it)."""

    client: Client
    router: str
    instance: int
    gen: int
    live: bool = True
    att: AttId | None = None
    last: dict[str, float] = field(default_factory=dict)


class Lacking:
    """A router of the mesh configured without the topic's guarantee: it answers PING with
    LACKING, as qrouter/guarantee.py does, and nothing else (issue 15 b)."""

    def __init__(self, sim: Simulation, name: str) -> None:
        self.sim = sim
        self.name = name

    def receive(self, src: str, msg: dict[str, Any], now: float) -> None:
        if isinstance(msg, dict) and msg.get("op") == "PING":
            self.sim.send_router(self.name, src, make("LACKING", msg["topic"]))

    def router_up(self, peer: str, now: float) -> None:
        pass

    def router_down(self, peer: str, now: float) -> None:
        pass


class Client:
    name: str
    conn: Conn | None = None


class PubClient(Client):
    def __init__(self, name: str, total: int) -> None:
        self.name = name
        self.pub: Pub = (f"{name}-container", f"{name}-link")
        self.total = total
        self.next_tag = 0
        self.unsettled: dict[bytes, list[Any]] = {}  # tag -> [message id, saw accepted]
        self.published: list[str] = []
        self.published_at: dict[str, float] = {}
        self.accepted: set[str] = set()


class SubClient(Client):
    def __init__(self, name: str) -> None:
        self.name = name
        self.sub: Sub = (f"{name}-container", f"{name}-link")
        self.unsettled: dict[bytes, bool] = {}  # out tag -> processed (accepted)
        self.bodies: dict[bytes, bytes] = {}  # received, not yet processed
        self.todo: deque[bytes] = deque()
        self.processed: Counter[str] = Counter()  # by the current subscription
        # A close (closed=true) ends a subscription; attaching again starts a new one, owed
        # what is published once every router knows it (known_at: all claim one of `atts`).
        self.past: list[Counter[str]] = []  # what the closed subscriptions processed
        self.atts: set[AttId] = set()
        self.known_at: float | None = None


class SimPort:
    """The `Port` of one router instance: every output becomes a scheduled arrival."""

    def __init__(self, sim: Simulation, router: str, instance: int) -> None:
        self.sim = sim
        self.router = router
        self.instance = instance

    def _out(self, method: str, *args: Any) -> None:
        r = self.sim.routers[self.router]
        if r.instance != self.instance:
            return
        if r.held:
            r.outbox.append((method, args))  # after the records it depends on (SimStore)
        else:
            self.do(method, args)

    def do(self, method: str, args: tuple[Any, ...]) -> None:
        if method == "to_router":
            self.sim.send_router(self.router, *args)
        elif method == "deliver":
            att, out_tag, body, _ = args
            self.sim.to_client(self.router, att, "deliver", out_tag, body)
        elif method == "settle_subscriber":
            self.sim.to_client(self.router, args[0], "settle", args[1])
        elif method == "accept_publisher":
            self.sim.to_client(self.router, args[0], "accept", args[1])
        elif method == "resend":
            self.sim.to_client(self.router, args[0], "resend", args[1])

    def to_router(self, router_id: str, message: dict[str, Any]) -> None:
        self._out("to_router", router_id, message)

    def deliver(self, att: AttId, out_tag: bytes, body: bytes, resume: bool) -> None:
        self._out("deliver", att, out_tag, body, resume)

    def settle_subscriber(self, att: AttId, out_tag: bytes) -> None:
        self._out("settle_subscriber", att, out_tag)

    def accept_publisher(self, pub: Pub, tag: bytes) -> None:
        self._out("accept_publisher", pub, tag)

    def resend(self, pub: Pub, tags: list[bytes]) -> None:
        self._out("resend", pub, tags)

    def log(self, level: str, msg: str) -> None:
        if level in ("warning", "error"):
            self.sim.note(f"LOG {level}: {msg}")


class Simulation:
    def __init__(self, seed: int, params: Params | None = None) -> None:
        self.seed = seed
        self.p = params or Params()
        self.rng = random.Random(seed)
        self.now = 0.0
        self._queue: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self.trace: list[str] = []
        self.faults = True
        self.steps = 0
        rng = self.rng
        names = [f"R{i}" for i in range(rng.randint(*self.p.routers))]
        self.routers = {n: SimRouter(n, MemoryRecordStore()) for n in names}
        # drawn apart from `rng`, so that a seed's schedule does not depend on the skew
        clocks = random.Random(f"{seed}/clocks")
        self.skew = {n: clocks.uniform(-self.p.clock_skew, self.p.clock_skew) for n in names}
        self.lacking = {
            f"L{i}": Lacking(self, f"L{i}") for i in range(rng.randint(*self.p.lacking))
        }
        every = names + sorted(self.lacking)
        self.channels = {(a, b): Channel(a, b) for i, a in enumerate(every) for b in every[i + 1 :]}
        self.pubs = [
            PubClient(f"P{i}", rng.randint(*self.p.messages))
            for i in range(rng.randint(*self.p.publishers))
        ]
        self.subs = [SubClient(f"S{i}") for i in range(rng.randint(*self.p.subscribers))]

    # -- the event loop ----------------------------------------------------------------------

    def at(self, when: float, fn: Callable[..., None], *args: Any) -> None:
        heapq.heappush(self._queue, (when, next(self._seq), fn, args))

    def after(self, delay: float, fn: Callable[..., None], *args: Any) -> None:
        self.at(self.now + delay, fn, *args)

    def run_until(self, end: float, done: Callable[[], bool] | None = None) -> None:
        check_at = self.now
        while self._queue and self._queue[0][0] <= end:
            when, _, fn, args = heapq.heappop(self._queue)
            self.now = when
            self.steps += 1
            fn(*args)
            if done is not None and when >= check_at:
                check_at = when + 0.5
                if done():
                    return
        self.now = max(self.now, end)

    def note(self, text: str) -> None:
        self.trace.append(f"{self.now:8.3f} {text}")

    def delay(self) -> float:
        r = self.rng.random()
        if r < 0.1:
            return self.rng.uniform(0.1, 0.6)  # a slow path: lets other channels overtake
        return self.rng.uniform(0.001, 0.03)

    # -- routers and channels ----------------------------------------------------------------

    def start_router(self, name: str) -> None:
        r = self.routers[name]
        if r.tr is not None:
            return
        r.instance += 1
        r.held, r.pending, r.outbox, r.failing_until = False, [], [], -1.0
        r.tr = TopicRouter(
            name,
            SimPort(self, name, r.instance),
            SimStore(self, r, r.instance),
            instance=r.instance,
            topic="events",
            mode=self.p.mode,
            terminus_timeout=self.p.terminus_timeout,
            ask_interval=0.5,
            now=self.now,
            unsafe=self.p.unsafe,
            clock=lambda: self.now + self.skew[name],
        )
        r.conns = {}
        self.note(f"{name} starts (instance {r.instance})")
        self.after(self.rng.uniform(0, TICK), self._tick, name, r.instance)

    def _tick(self, name: str, instance: int) -> None:
        r = self.routers[name]
        if r.tr is None or r.instance != instance:
            return
        r.tr.tick(self.now)
        self.after(TICK, self._tick, name, instance)

    def crash_router(self, name: str) -> None:
        r = self.routers[name]
        if r.tr is None:
            return
        self.note(f"{name} CRASHES" + (" (with held commits: lost)" if r.held else ""))
        r.tr = None
        r.held, r.pending, r.outbox = False, [], []
        for ch in self.channels.values():
            if name in (ch.a, ch.b):
                self.channel_down(ch)
        for conn in list(r.conns.values()):
            self.drop_conn(conn, router_side=False)
        r.conns = {}

    def node(self, name: str) -> TopicRouter | Lacking | None:
        if name in self.lacking:
            return self.lacking[name]
        return self.routers[name].tr

    def channel_up(self, ch: Channel) -> None:
        if ch.up or self.node(ch.a) is None or self.node(ch.b) is None:
            return
        ch.up = True
        ch.gen += 1
        ch.last = {}
        self.note(f"channel {ch.a}-{ch.b} up")
        na = self.node(ch.a)
        assert na is not None
        na.router_up(ch.b, self.now)
        nb = self.node(ch.b)
        if nb is not None and ch.up:
            nb.router_up(ch.a, self.now)

    def channel_down(self, ch: Channel) -> None:
        if not ch.up:
            return
        ch.up = False
        ch.gen += 1
        self.note(f"channel {ch.a}-{ch.b} down")
        for me, peer in ((ch.a, ch.b), (ch.b, ch.a)):
            node = self.node(me)
            if node is not None:
                node.router_down(peer, self.now)

    def channel(self, a: str, b: str) -> Channel:
        return self.channels[(a, b) if (a, b) in self.channels else (b, a)]

    def send_router(self, src: str, dst: str, msg: dict[str, Any]) -> None:
        ch = self.channel(src, dst)
        if not ch.up:
            return
        when = max(self.now + self.delay(), ch.last.get(dst, 0.0))
        ch.last[dst] = when
        self.at(when, self._arrive_router, ch, ch.gen, src, dst, msg)

    def _arrive_router(self, ch: Channel, gen: int, src: str, dst: str, msg: Any) -> None:
        node = self.node(dst)
        if ch.up and ch.gen == gen and node is not None:
            node.receive(src, msg, self.now)

    # -- client connections ------------------------------------------------------------------

    def connect(self, client: Client) -> None:
        if client.conn is not None:
            return
        name = self.rng.choice(sorted(self.routers))
        r = self.routers[name]
        if r.tr is None:
            self.after(self.rng.uniform(0.1, 0.5), self.connect, client)
            return
        if r.held:  # store unavailable: durable attaches refused, the client tries again
            self.after(self.rng.uniform(0.1, 0.5), self.connect, client)
            return
        conn = Conn(client, name, r.instance, next(self._seq))
        client.conn = conn
        if isinstance(client, SubClient):
            unsettled = list(client.unsettled.items())
            conn.att = r.tr.new_attachment_id()
            client.atts.add(conn.att)
            r.conns[conn.att] = conn
            r.tr.subscriber_attached(client.sub, unsettled, self.now, conn.att)
            self.note(f"{client.name} attaches at {name} as {conn.att}, map {len(unsettled)}")
        elif isinstance(client, PubClient):
            r.conns[client.pub] = conn
            unsettled_p = [(t, bool(acc)) for t, (_, acc) in client.unsettled.items()]
            for tag in [t for t, (_, acc) in client.unsettled.items() if acc]:
                del client.unsettled[tag]  # it saw ACCEPTED: it settles on resume
            self.note(f"{client.name} attaches at {name}, map {len(unsettled_p)}")
            r.tr.publisher_attached(client.pub, unsettled_p, self.now)

    def drop_conn(self, conn: Conn, router_side: bool = True) -> None:
        if not conn.live:
            return
        conn.live = False
        client = conn.client
        client.conn = None
        r = self.routers[conn.router]
        self.note(f"{client.name} connection to {conn.router} drops")
        if router_side and r.tr is not None and r.instance == conn.instance:
            if isinstance(client, SubClient) and conn.att is not None:
                r.conns.pop(conn.att, None)
                r.tr.subscriber_detached(conn.att, False, self.now)
            elif isinstance(client, PubClient):
                r.conns.pop(client.pub, None)
                r.tr.publisher_detached(client.pub, False, self.now)
        self.after(self.rng.uniform(0.05, 0.8), self.connect, client)

    def to_client(self, router: str, key: AttId | Pub, what: str, *args: Any) -> None:
        conn = self.routers[router].conns.get(key)
        if conn is None or not conn.live:
            return
        when = max(self.now + self.rng.uniform(0.001, 0.02), conn.last.get("in", 0.0))
        conn.last["in"] = when
        self.at(when, self._arrive_client, conn, what, args)

    def to_router_from(self, conn: Conn, what: str, *args: Any) -> None:
        when = max(self.now + self.rng.uniform(0.001, 0.02), conn.last.get("out", 0.0))
        conn.last["out"] = when
        self.at(when, self._arrive_from_client, conn, what, args)

    def _arrive_from_client(self, conn: Conn, what: str, args: tuple[Any, ...]) -> None:
        r = self.routers[conn.router]
        tr = r.tr
        if not conn.live or tr is None or r.instance != conn.instance:
            return
        client = conn.client
        if isinstance(client, PubClient):
            if what == "transfer":
                tr.publisher_transfer(client.pub, args[0], args[1], self.now)
            elif what == "settle":
                tr.publisher_settled(client.pub, args[0], self.now)
        elif conn.att is not None:
            if what == "accepted":
                tr.subscriber_accepted(conn.att, args[0], self.now)
            elif what == "settled":
                tr.subscriber_settled(conn.att, args[0], self.now)

    def _arrive_client(self, conn: Conn, what: str, args: tuple[Any, ...]) -> None:
        if not conn.live:
            return
        client = conn.client
        if isinstance(client, PubClient):
            self._pub_event(client, conn, what, args)
        elif isinstance(client, SubClient):
            self._sub_event(client, conn, what, args)

    # -- publishers --------------------------------------------------------------------------

    def _pub_event(self, c: PubClient, conn: Conn, what: str, args: tuple[Any, ...]) -> None:
        if what == "accept":
            tag = args[0]
            entry = c.unsettled.get(tag)
            if entry is None:
                return
            entry[1] = True  # saw ACCEPTED (persisted); settles now or a little later
            c.accepted.add(entry[0])
            self.note(f"{c.name} ACCEPTED {entry[0]}")
            if self.rng.random() < 0.7:
                self._pub_settle(c, conn, tag)
            else:
                self.after(self.rng.uniform(0.0, 0.5), self._pub_settle, c, conn, tag)
        elif what == "resend":
            for tag in args[0]:
                entry = c.unsettled.get(tag)
                if entry is not None and not entry[1]:
                    self.to_router_from(conn, "transfer", tag, entry[0].encode())

    def _pub_settle(self, c: PubClient, conn: Conn, tag: bytes) -> None:
        if conn.live and tag in c.unsettled:
            del c.unsettled[tag]
            self.to_router_from(conn, "settle", tag)

    def publish(self, c: PubClient) -> None:
        if len(c.published) >= c.total:
            return
        self.after(self.rng.uniform(0.05, 0.5), self.publish, c)
        if c.conn is None or len(c.unsettled) >= self.p.window:
            return
        c.next_tag += 1
        tag = f"t{c.next_tag}".encode()
        msg_id = f"{c.name}.{c.next_tag}"
        c.unsettled[tag] = [msg_id, False]
        c.published.append(msg_id)
        c.published_at[msg_id] = self.now
        self.note(f"{c.name} publishes {msg_id} at {c.conn.router}")
        self.to_router_from(c.conn, "transfer", tag, msg_id.encode())

    # -- subscribers -------------------------------------------------------------------------

    def _sub_event(self, c: SubClient, conn: Conn, what: str, args: tuple[Any, ...]) -> None:
        eo = self.p.mode == EXACTLY_ONCE
        if what == "deliver":
            out_tag, body = args
            if not eo:
                c.bodies[out_tag] = body
                c.todo.append(out_tag)
            elif out_tag not in c.unsettled:
                c.unsettled[out_tag] = False  # received (persisted), to be processed
                c.bodies[out_tag] = body
                c.todo.append(out_tag)
            elif c.unsettled[out_tag]:
                self.to_router_from(conn, "accepted", out_tag)
            elif out_tag not in c.bodies:
                c.bodies[out_tag] = body  # resumed: the message of a placeholder
                c.todo.append(out_tag)
            self.after(self.rng.uniform(0.0, 0.3), self.process, c)
        elif what == "settle":
            out_tag = args[0]
            c.unsettled.pop(out_tag, None)
            c.bodies.pop(out_tag, None)
            self.to_router_from(conn, "settled", out_tag)  # "I have seen it" (our client)

    def process(self, c: SubClient) -> None:
        eo = self.p.mode == EXACTLY_ONCE
        while c.todo:
            out_tag = c.todo.popleft()
            body = c.bodies.pop(out_tag, None)
            if body is None or (eo and c.unsettled.get(out_tag) is not False):
                continue
            msg_id = body.decode()
            c.processed[msg_id] += 1  # the application's work and the map change: one commit
            if eo:
                c.unsettled[out_tag] = True
            self.note(f"{c.name} processes {msg_id} (x{c.processed[msg_id]})")
            if c.conn is not None:
                self.to_router_from(c.conn, "accepted", out_tag)
            return

    # -- faults ------------------------------------------------------------------------------

    def fault(self) -> None:
        if not self.faults:
            return
        self.after(self.rng.expovariate(1 / self.p.fault_every), self.fault)
        if self.p.store_failures and self.rng.random() < self.p.store_failures:
            self.store_failure()
            return
        kind = self.rng.random()
        if kind < 0.35:
            ch = self.rng.choice(sorted(self.channels.values(), key=lambda c: (c.a, c.b)))
            if ch.up:
                self.channel_down(ch)
                self.after(self.rng.uniform(0.05, 1.0), self.channel_up, ch)
        elif kind < 0.6:
            alive = [n for n, r in sorted(self.routers.items()) if r.tr is not None]
            if len(alive) > 1:
                name = self.rng.choice(alive)
                self.crash_router(name)
                self.after(self.rng.uniform(0.1, 1.5), self.restart, name)
        else:
            clients: list[Client] = [*self.pubs, *self.subs]
            client = self.rng.choice(clients)
            if client.conn is None:
                return
            if isinstance(client, SubClient) and self.rng.random() < self.p.close_share:
                self.close_sub(client)
            elif self.p.half_open and self.rng.random() < self.p.half_open:
                self.half_open(client.conn)
            else:
                self.drop_conn(client.conn)

    def half_open(self, conn: Conn) -> None:
        """The client's connection is gone for the client (what it sends and what is sent to
        it is lost) while its router still holds the link until its idle timeout."""
        client = conn.client
        conn.live = False
        client.conn = None
        self.note(f"{client.name} connection to {conn.router} HALF-OPEN")
        self.after(self.p.idle_timeout, self._idle_expired, conn)
        self.after(self.p.failover_wait, self.connect, client)

    def _idle_expired(self, conn: Conn) -> None:
        r = self.routers[conn.router]
        client = conn.client
        key = conn.att if conn.att is not None else getattr(client, "pub", None)
        if r.tr is None or r.instance != conn.instance or r.conns.get(key) is not conn:  # type: ignore[arg-type]
            return
        self.note(f"{conn.router} closes {client.name}'s idle connection")
        r.conns.pop(key)  # type: ignore[arg-type]
        if conn.att is not None:
            r.tr.subscriber_detached(conn.att, False, self.now)
        elif isinstance(client, PubClient):
            r.tr.publisher_detached(client.pub, False, self.now)

    def store_failure(self) -> None:
        alive = [n for n, r in sorted(self.routers.items()) if r.tr is not None]
        name = self.rng.choice(alive)
        r = self.routers[name]
        r.failing_until = self.now + self.rng.uniform(0.05, 1.0)
        self.note(f"{name} store starts failing until {r.failing_until:.3f}")

    def retry_store(self, name: str, instance: int) -> None:
        """The router's retry (qrouter/store_health.py): commit what waits, then release the
        outputs held behind it, in order."""
        r = self.routers[name]
        if r.tr is None or r.instance != instance or not r.held:
            return
        if self.now < r.failing_until:
            self.after(self.rng.uniform(0.05, 0.3), self.retry_store, name, instance)
            return
        self.note(f"{name} store retry commits {len(r.pending)} held batches")
        for puts, deletes in r.pending:
            r.store.commit(puts, deletes)
        outbox, r.pending, r.outbox, r.held = r.outbox, [], [], False
        port = SimPort(self, name, instance)
        for method, args in outbox:
            port.do(method, args)

    def close_sub(self, c: SubClient) -> None:
        """The subscriber detaches with closed=true (its terminus ends, AMQP 1.0 §2.6.6, and
        so does its unsettled state); a little later it attaches again under the same
        container-id and link name: a new subscription (issue 15 a)."""
        conn = c.conn
        assert conn is not None and conn.att is not None
        conn.live = False
        c.conn = None
        r = self.routers[conn.router]
        self.note(f"{c.name} CLOSES its link at {conn.router}")
        if r.tr is not None and r.instance == conn.instance:
            r.conns.pop(conn.att, None)
            r.tr.subscriber_detached(conn.att, True, self.now)
        c.past.append(c.processed)
        c.processed = Counter()
        c.unsettled.clear()
        c.bodies.clear()
        c.todo.clear()
        c.atts = set()
        c.known_at = None
        self.after(self.rng.uniform(0.05, 0.8), self.connect, c)

    def _watch_known(self) -> None:
        """When every router knows a subscription (its latest claim is one of this
        subscription's attachments): what is published from then on is owed to it."""
        self.after(0.1, self._watch_known)
        for c in self.subs:
            if c.known_at is not None or not c.atts:
                continue
            trs = [r.tr for r in self.routers.values()]
            if all(
                tr is not None
                and c.sub in tr.view.known
                and (
                    tr.view.last_att.get(c.sub) in c.atts
                    or any(claim.att in c.atts for claim in tr.view.claims_of(c.sub))
                )
                for tr in trs
            ):
                c.known_at = self.now
                self.note(f"{c.name} known everywhere")

    def restart(self, name: str) -> None:
        self.start_router(name)
        for ch in self.channels.values():
            if name in (ch.a, ch.b):
                self.after(self.rng.uniform(0.0, 0.2), self.channel_up, ch)

    def heal(self) -> None:
        self.faults = False
        self.note("QUIET: no more faults")
        for name in sorted(self.routers):
            self.start_router(name)
        for ch in sorted(self.channels.values(), key=lambda c: (c.a, c.b)):
            self.channel_up(ch)
        for client in [*self.pubs, *self.subs]:
            self.connect(client)

    # -- the schedule ------------------------------------------------------------------------

    def run(self) -> Simulation:
        for name in sorted(self.routers):
            self.start_router(name)
        for ch in self.channels.values():
            self.channel_up(ch)
        for s in self.subs:
            self.connect(s)
        self._watch_known()
        everyone = {s.sub for s in self.subs}
        for _ in range(100):
            self.run_until(self.now + 0.1)
            if all(
                r.tr is not None and everyone <= set(r.tr.view.known) for r in self.routers.values()
            ):
                break
        else:
            raise AssertionError("setup: subscribers not known everywhere")
        start = self.now
        for c in self.pubs:
            self.connect(c)
            self.after(self.rng.uniform(0.0, 0.3), self.publish, c)
        self.after(self.rng.expovariate(1 / self.p.fault_every), self.fault)
        self.run_until(start + self.p.chaos)
        self.heal()
        self.run_until(self.now + self.p.deadline, self.drained)
        return self

    def drained(self) -> bool:
        if any(len(c.published) < c.total or c.unsettled or c.conn is None for c in self.pubs):
            return False
        if any(c.todo or c.conn is None or c.known_at is None for c in self.subs):
            return False
        if self.p.mode == AT_LEAST_ONCE:
            return self._all_processed()
        if any(c.unsettled for c in self.subs):
            return False
        return all(
            r.tr is not None and not r.tr.origin_records() and not r.tr.local_records()
            for r in self.routers.values()
        )

    def _all_processed(self) -> bool:
        return all(s.processed[m] >= 1 for s in self.subs for m in self.owed(s))

    def owed(self, s: SubClient) -> set[str]:
        """The accepted messages the current subscription of `s` must have processed: those
        published once every router knew it (all, if it never became known)."""
        at = {m: t for c in self.pubs for m, t in c.published_at.items()}
        accepted = set().union(*(c.accepted for c in self.pubs))
        return {m for m in accepted if s.known_at is None or at[m] >= s.known_at}

    def violations(self) -> list[str]:
        out: list[str] = []
        eo = self.p.mode == EXACTLY_ONCE
        accepted: set[str] = set()
        for c in self.pubs:
            accepted |= c.accepted
            missing = [m for m in c.published if m not in c.accepted]
            if len(c.published) < c.total:
                out.append(f"{c.name} published only {len(c.published)} of {c.total}")
            if missing:
                out.append(f"{c.name} never saw ACCEPTED for {missing}")
            if c.unsettled:
                out.append(f"{c.name} still has unsettled {sorted(c.unsettled)}")
        for s in self.subs:
            if s.known_at is None:
                out.append(f"{s.name}: its subscription never became known everywhere")
            for m in sorted(self.owed(s)):
                n = s.processed[m]
                if n == 0 or (eo and n > 1):
                    out.append(f"{s.name} processed accepted {m} {n} times")
            for i, processed in enumerate([*s.past, s.processed]):
                for m, n in sorted(processed.items()):
                    if eo and n > 1:
                        out.append(f"{s.name} (subscription {i}) processed {m} {n} times")
            if eo and s.unsettled:
                out.append(f"{s.name} still has {len(s.unsettled)} unsettled deliveries")
        if eo:
            for name, r in sorted(self.routers.items()):
                if r.tr is not None and (r.tr.origin_records() or r.tr.local_records()):
                    out.append(
                        f"{name} still holds {len(r.tr.origin_records())} origin and "
                        f"{len(r.tr.local_records())} local records"
                    )
        return out

    def report(self, last: int = 400) -> str:
        lines = [
            f"seed {self.seed}: {len(self.routers)} routers, "
            f"{[(c.name, c.total) for c in self.pubs]}, {[s.name for s in self.subs]}, "
            f"mode {self.p.mode}, unsafe {list(self.p.unsafe)}",
            *[f"VIOLATION: {v}" for v in self.violations()],
            f"--- trace (last {last} of {len(self.trace)} events) ---",
            *self.trace[-last:],
        ]
        return "\n".join(lines)


def run(seed: int, params: Params | None = None) -> Simulation:
    return Simulation(seed, params).run()


def first_failure(seeds: Iterable[int], params: Params | None = None) -> Simulation | None:
    for seed in seeds:
        sim = run(seed, params)
        if sim.violations():
            return sim
    return None


def main(argv: list[str]) -> int:
    seed = int(argv[1]) if len(argv) > 1 else 0
    mode = argv[2] if len(argv) > 2 else EXACTLY_ONCE
    unsafe = tuple(a for a in argv[3:] if a != "store-failures")
    base = STORE_PARAMS if "store-failures" in argv[3:] else CI_PARAMS
    sim = run(seed, Params(**{**base.__dict__, "mode": mode, "unsafe": unsafe}))
    print(sim.report(last=10**9))
    return 1 if sim.violations() else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
