"""Clients of guaranteed topics for the tests: publishers and subscribers on our client API
(qrouter/client.py), which resume their links after a failover, and what they saw."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from qrouter.client import Client, Message, Outcome
from tests.client.conftest import wait_until
from tests.harness import MeshRouter, free_port

OPTS: dict[str, Any] = {"backoff": (0.05, 0.5), "reconnect_timeout": 120.0, "connect_timeout": 3.0}

log = logging.getLogger("tests.guarantee")


@dataclass
class Publisher:
    """Publishes numbered messages ("<name>:<n>") with at most `window` unsettled."""

    client: Client
    name: str
    sender: Any
    window: int = 20
    sent: int = 0
    outcomes: dict[str, str] = field(default_factory=dict)
    pending: set[asyncio.Future[Outcome]] = field(default_factory=set)

    @classmethod
    async def start(
        cls, urls: Sequence[str], name: str, topic: str, exactly_once: bool = True, **kw: Any
    ) -> Publisher:
        client = await Client.connect(list(urls), name, **OPTS)
        sender = await client.sender(topic, name, exactly_once=exactly_once)
        return cls(client, name, sender, **kw)

    async def publish(self, n: int, pace: float = 0.0) -> None:
        for _ in range(n):
            while len(self.pending) >= self.window:
                await asyncio.wait(self.pending, return_when=asyncio.FIRST_COMPLETED)
            body = f"{self.name}:{self.sent}"
            self.sent += 1
            fut = self.sender.submit(Message(body=body))
            self.pending.add(fut)
            fut.add_done_callback(lambda f, b=body: self._done(b, f))
            if pace:
                await asyncio.sleep(pace)

    def _done(self, body: str, fut: asyncio.Future[Outcome]) -> None:
        self.pending.discard(fut)
        if fut.cancelled():
            self.outcomes[body] = "cancelled"
        elif fut.exception() is not None:
            self.outcomes[body] = f"error: {fut.exception()}"
        else:
            self.outcomes[body] = fut.result().state

    def accepted(self) -> set[str]:
        return {b for b, s in self.outcomes.items() if s == "accepted"}

    async def close(self) -> None:
        await self.client.close()


@dataclass
class Subscriber:
    """Processes (records, then accepts) every message it is given, in a task."""

    client: Client
    name: str
    receiver: Any
    processed: Counter[str] = field(default_factory=Counter)
    task: asyncio.Task[None] | None = None

    @classmethod
    async def start(
        cls, urls: Sequence[str], name: str, topic: str, exactly_once: bool = True
    ) -> Subscriber:
        client = await Client.connect(list(urls), name, **OPTS)
        receiver = await client.receiver(topic, name, exactly_once=exactly_once, credit=50)
        s = cls(client, name, receiver)
        s.task = asyncio.get_running_loop().create_task(s._run())
        return s

    async def _run(self) -> None:
        async for received in self.receiver:
            self.processed[received.message.body] += 1
            await received.accept()

    def duplicates(self) -> dict[str, int]:
        return {b: n for b, n in self.processed.items() if n > 1}

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
        await self.client.close()


def topic_rows(url: str) -> list[dict[str, Any]]:
    """The routers's guaranteed topics (management QUERY of type topic); blocking."""
    from qrouter_tools.management_client import ConnectOptions, ManagementClient

    with ManagementClient(ConnectOptions(url=url, timeout=5.0)) as c:
        return c.query("topic")


def open_listener(url: str, port: int) -> None:
    """A listener on `port` (127.0.0.1) opened by management (CREATE listener) on the router
    at `url`; it accepts when this returns. A router restarted on a port its clients do not
    know, then given theirs this way, is read before any of them can be back: reading it
    on their port races their reconnect (they retry every backoff)."""
    from qrouter_tools.management_client import ConnectOptions, ManagementClient

    with ManagementClient(ConnectOptions(url=url, timeout=5.0)) as c:
        c.call("CREATE", "listener", name="clients", body={"host": "127.0.0.1", "port": port})


async def subscriber_then_publisher(
    url: str, credit: int, **client_opts: Any
) -> tuple[Client, Any, Client, Any]:
    """On one router: an exactly-once subscriber "sub" of TOPIC, known to the topic (its
    management row), then a publisher "pub": (its client, receiver, its client, sender)."""
    subc = await Client.connect(url, "sub", **client_opts)
    receiver = await subc.receiver(TOPIC, "sub", exactly_once=True, credit=credit)
    await wait_until(
        lambda: [row["subscribers"] for row in topic_rows(url)] == [1], 10, lambda: "sub"
    )
    pubc = await Client.connect(url, "pub", **client_opts)
    sender = await pubc.sender(TOPIC, "pub", exactly_once=True)
    return subc, receiver, pubc, sender


def accept_all(receiver: Any, bodies: list[str]) -> asyncio.Task[None]:
    """A task that accepts every message `receiver` gets, its body appended to `bodies`
    first (cancel it when done)."""

    async def consume() -> None:
        async for received in receiver:
            bodies.append(received.message.body)
            await received.accept()

    return asyncio.get_running_loop().create_task(consume())


def lmdb_topic_router(router: Any, name: str, port: int, store: Any) -> Any:
    """The `router` fixture's router "r" on `port`, TOPIC exactly-once, its LMDB store in
    `store` (a path): the same router again after a kill, if started again."""
    return router(
        name,
        router_id="r",
        listeners=[{"port": port}],
        addresses={TOPIC: "multicast,exactly-once"},
        extra_args=["--store", "lmdb", "--store-path", str(store)],
    )


async def publish_and_hold(sender: Any, receiver: Any, n: int) -> tuple[list[Any], list[Any]]:
    """Messages m0..m<n-1> published; each received and held (not accepted yet): (the
    publisher's outcome futures, the received messages)."""
    futs = [sender.submit(Message(body=f"m{i}")) for i in range(n)]
    held = [await receiver.receive(timeout=10) for _ in range(n)]
    assert sorted(h.message.body for h in held) == [f"m{i}" for i in range(n)]
    return futs, held


async def records_held(urls: Sequence[str]) -> dict[str, tuple[int, int]]:
    """url -> (origin records, local records) summed over its topics."""
    out = {}
    for url in urls:
        rows = await asyncio.to_thread(topic_rows, url)
        out[url] = (
            sum(int(r["origin_records"]) for r in rows),
            sum(int(r["local_records"]) for r in rows),
        )
    return out


TOPIC = "events"


class Routers:
    """Routers (by default A, B, C, each connected to the other two) on fixed ports, so that a
    killed one restarts where its neighbours and clients look for it, on the same store."""

    def __init__(
        self,
        router: Any,
        names: tuple[str, ...] = ("A", "B", "C"),
        guarantee: str = "exactly-once",
        edges: list[tuple[str, str]] | None = None,
        extra_args: Callable[[str], list[str]] | None = None,
        lacking: tuple[str, ...] = (),
    ) -> None:
        self.extra_args = extra_args
        self.make = router
        self.names = names
        self.addresses = {TOPIC: f"multicast,{guarantee}"}
        self.lacking = lacking  # routers configured without the guarantee (a mismatch)
        self.inter = {n: free_port() for n in names}
        self.client = {n: free_port() for n in names}
        # (a, b): b connects to a; by default every pair (a full mesh)
        self.edges = edges or [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
        self.r: dict[str, Any] = {}
        for n in names:
            self.start(n, first=True)

    def start(self, name: str, first: bool = False) -> None:
        # at first start a router connects to those started before it; restarted, to all its
        # neighbours (they keep trying too, either way meets)
        started = self.names[: self.names.index(name)]
        connect = [
            self.inter[a if b == name else b]
            for a, b in self.edges
            if name in (a, b) and (not first or (a if b == name else b) in started)
        ]
        self.r[name] = self.make(
            name,
            cls=MeshRouter,
            inter_port=self.inter[name],
            connect=connect,
            listeners=[{"port": self.client[name]}],
            addresses={TOPIC: "multicast"} if name in self.lacking else self.addresses,
            extra_args=self.extra_args(name) if self.extra_args else (),
            log_level="info",
        )

    def url(self, name: str) -> str:
        return f"amqp://127.0.0.1:{self.client[name]}"

    def urls(self, first: str) -> list[str]:
        """Every router's URL, `first` first: where a client connects, then fails over to."""
        i = self.names.index(first)
        return [self.url(n) for n in self.names[i:] + self.names[:i]]

    def all_urls(self) -> list[str]:
        return [self.url(n) for n in self.names]


async def wait_subscribers_known(tri: Routers, n: int, timeout: float = 30.0) -> None:
    """Until every router knows all `n` subscribers (they are then owed every message)."""

    async def known() -> list[int]:
        out = []
        for url in [tri.url(n) for n in tri.names if n not in tri.lacking]:
            rows = await asyncio.to_thread(topic_rows, url)
            out.append(sum(int(r["known_subscribers"]) for r in rows if r["name"] == TOPIC))
        return out

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (k := await known()) != [n] * (len(tri.names) - len(tri.lacking)):
        if loop.time() > deadline:
            raise AssertionError(f"routers know {k} subscribers, not {n} each")
        await asyncio.sleep(0.2)


def check_exactly_once(
    pubs: list[Publisher], subs: list[Subscriber], duplicates_allowed: bool = False
) -> None:
    """Every message accepted to its publisher and processed by every subscriber once (at
    least once with `duplicates_allowed`: the at-least-once guarantee)."""
    sent = {f"{p.name}:{i}" for p in pubs for i in range(p.sent)}
    accepted = set().union(*(p.accepted() for p in pubs))
    not_accepted = {b: s for p in pubs for b, s in p.outcomes.items() if s != "accepted"}
    assert not not_accepted, (
        f"outcomes other than accepted: {dict(list(not_accepted.items())[:10])}"
    )
    assert accepted == sent, (
        f"{len(sent - accepted)} never settled, e.g. {sorted(sent - accepted)[:5]}"
    )
    for s in subs:
        missing = accepted - set(s.processed)
        assert not missing, f"{s.name} never processed {len(missing)}, e.g. {sorted(missing)[:5]}"
        if not duplicates_allowed:
            dupes = list(s.duplicates().items())[:5]
            assert not s.duplicates(), f"{s.name} processed twice: {dupes}"
        extra = set(s.processed) - sent
        assert not extra, f"{s.name} processed messages nobody sent: {sorted(extra)[:5]}"


async def drained(
    tri: Routers, pubs: list[Publisher], subs: list[Subscriber], timeout: float
) -> None:
    """Until publishers have nothing unsettled, subscribers nothing unsettled, routers no
    records."""
    await wait_until(
        lambda: all(p.sender.unsettled == 0 and not p.pending for p in pubs),
        timeout,
        lambda: f"publishers unsettled {[p.sender.unsettled for p in pubs]}",
    )
    await wait_until(
        lambda: all(s.receiver.unsettled == 0 for s in subs),
        timeout,
        # the tags too: a router's log (kept for a restarted one as <name>.out.1) tells its story
        lambda: f"subscribers unsettled {[s.receiver.unsettled_tags()[:5] for s in subs]}",
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        held = await records_held(tri.all_urls())
        if all(h == (0, 0) for h in held.values()):
            return
        if loop.time() > deadline:
            raise AssertionError(f"routers still hold records (origin, local): {held}")
        await asyncio.sleep(0.2)


async def publish_all_once(
    tri: Routers, pubs: list[Publisher], subs: list[Subscriber], n: int = 200
) -> None:
    """Each publisher sends `n` at once; then every message is processed exactly once, the
    routers hold no records, and the clients close."""
    await asyncio.gather(*(p.publish(n) for p in pubs))
    await drained(tri, pubs, subs, 30)
    check_exactly_once(pubs, subs)
    for c in pubs + subs:
        await c.close()
