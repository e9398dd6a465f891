"""Exactly-once publish/subscribe across a mesh of real routers (issue 5; docs/exactly-once.md).

Three `qrouter` processes in a triangle carry a topic with ``guarantee = "exactly-once"``;
publishers and subscribers use our client (durable links, receiver-settle-mode second), which
resumes its links wherever it reconnects.
"""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any

import pytest

from tests.client.conftest import run
from tests.guarantee.common import Publisher, Subscriber, records_held, topic_rows, wait_until
from tests.harness import MeshRouter, free_port

TOPIC = "events"
DURABLE = os.environ.get("QROUTER_STORE", "memory") != "memory"


class Triangle:
    """Routers A, B, C, each connected to the other two, on fixed ports so that a killed one
    restarts where its neighbours and clients look for it, on the same store."""

    def __init__(
        self, router: Any, names: tuple[str, ...] = ("A", "B", "C"), guarantee: str = "exactly-once"
    ) -> None:
        self.make = router
        self.names = names
        self.addresses = {TOPIC: f"multicast,{guarantee}"}
        self.inter = {n: free_port() for n in names}
        self.client = {n: free_port() for n in names}
        self.r: dict[str, Any] = {}
        for i, n in enumerate(names):
            self.start(n, connect=[self.inter[m] for m in names[:i]])

    def start(self, name: str, connect: list[int] | None = None) -> None:
        if connect is None:
            connect = [self.inter[m] for m in self.names if m != name]
        self.r[name] = self.make(
            name,
            cls=MeshRouter,
            inter_port=self.inter[name],
            connect=connect,
            listeners=[{"port": self.client[name]}],
            addresses=self.addresses,
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


async def wait_subscribers_known(tri: Triangle, n: int, timeout: float = 30.0) -> None:
    """Until every router knows all `n` subscribers (they are then owed every message)."""

    async def known() -> list[int]:
        out = []
        for url in tri.all_urls():
            rows = await asyncio.to_thread(topic_rows, url)
            out.append(sum(int(r["known_subscribers"]) for r in rows if r["name"] == TOPIC))
        return out

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (k := await known()) != [n] * len(tri.names):
        if loop.time() > deadline:
            raise AssertionError(f"routers know {k} subscribers, not {n} each")
        await asyncio.sleep(0.2)


def check_exactly_once(pubs: list[Publisher], subs: list[Subscriber]) -> None:
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
        assert not s.duplicates(), f"{s.name} processed twice: {list(s.duplicates().items())[:5]}"
        extra = set(s.processed) - sent
        assert not extra, f"{s.name} processed messages nobody sent: {sorted(extra)[:5]}"


async def drained(
    tri: Triangle, pubs: list[Publisher], subs: list[Subscriber], timeout: float
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
        lambda: f"subscribers unsettled {[s.receiver.unsettled for s in subs]}",
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


@pytest.mark.parametrize("guarantee", ["exactly-once", "at-least-once"])
def test_triangle_every_subscriber_gets_every_message_once(router: Any, guarantee: str) -> None:
    # at-least-once: clients settle first (receiver-settle-mode first); with no fault there is
    # nothing to duplicate either
    eo = guarantee == "exactly-once"
    tri = Triangle(router, guarantee=guarantee)

    async def scenario() -> None:
        subs = [
            await Subscriber.start(tri.urls(n), f"sub-{n}", TOPIC, exactly_once=eo)
            for n in tri.names
        ]
        await wait_subscribers_known(tri, len(subs))
        pubs = [
            await Publisher.start(tri.urls("A"), "pub-A", TOPIC, exactly_once=eo),
            await Publisher.start(tri.urls("B"), "pub-B", TOPIC, exactly_once=eo),
        ]
        await asyncio.gather(*(p.publish(200) for p in pubs))
        await drained(tri, pubs, subs, 30)
        check_exactly_once(pubs, subs)
        for c in pubs + subs:
            await c.close()

    run(scenario(), timeout=120)


@pytest.mark.skipif(
    not DURABLE,
    reason="routers restart on their store: runs in the lmdb and leveldb tox envs (QROUTER_STORE)",
)
@pytest.mark.timeout(300)
def test_chaos_routers_killed_and_restarted_exactly_once(router: Any) -> None:
    """Issue 5 (b): 2 publishers, 3 subscribers, routers SIGKILLed and restarted at random for
    CHAOS_SECONDS; clients fail over between routers. Afterwards every subscriber processed
    every message exactly once and every publisher saw every message accepted."""
    seconds = float(os.environ.get("QROUTER_CHAOS_SECONDS", "60"))
    seed = int(os.environ.get("QROUTER_CHAOS_SEED", str(random.randrange(1 << 30))))
    rng = random.Random(seed)
    print(f"chaos seed {seed} (QROUTER_CHAOS_SEED={seed} reproduces the schedule of kills)")
    tri = Triangle(router)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        subs = [await Subscriber.start(tri.urls(n), f"sub-{n}", TOPIC) for n in tri.names]
        await wait_subscribers_known(tri, len(subs))
        pubs = [
            await Publisher.start(tri.urls("A"), "pub-1", TOPIC, window=10),
            await Publisher.start(tri.urls("B"), "pub-2", TOPIC, window=10),
        ]
        stop = loop.time() + seconds
        kills: list[str] = []

        async def publish(p: Publisher) -> None:
            while loop.time() < stop:
                await p.publish(1, pace=0.02)

        async def chaos() -> None:
            while loop.time() < stop:
                await asyncio.sleep(rng.uniform(2.0, 6.0))
                if loop.time() >= stop:
                    break
                victim = rng.choice(tri.names)
                kills.append(victim)
                tri.r[victim].kill()
                await asyncio.sleep(rng.uniform(0.3, 2.0))
                await asyncio.to_thread(tri.start, victim)

        await asyncio.gather(chaos(), *(publish(p) for p in pubs))
        print(f"{len(kills)} kills: {kills}; published {[p.sent for p in pubs]}")
        await drained(tri, pubs, subs, 90)
        check_exactly_once(pubs, subs)
        assert len(kills) >= seconds // 12, "the chaos phase killed routers now and then"
        assert min(p.sent for p in pubs) >= seconds * 5, "messages flowed throughout"
        for c in pubs + subs:
            await c.close()

    run(scenario(), timeout=seconds + 200)
