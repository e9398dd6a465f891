"""Link resumption across router crashes (AMQP 1.0 §2.6.13; issue 3, acceptance 1).

A durable sender and a durable receiver (the client API, durability 2, expiry never) move
traffic through a router started with a durable store; the router is SIGKILLed at random
points while deliveries are in flight and restarted on the same store and port. Both clients
reconnect and re-attach presenting their unsettled maps. Exactly-once: every message is
processed once by the receiving application and every sender sees every outcome.
At-least-once: every message is processed (duplicates allowed) and every outcome seen.

These need the router's side of resumption (link registry + durable termini store).
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from qrouter import stores
from qrouter.client import Client, Message, Outcome, Received
from tests.client.conftest import run, wait_until
from tests.harness import free_port

STORES = [
    pytest.param(
        name,
        id=name,
        marks=pytest.mark.skipif(
            not stores.available(name),
            reason=f"the {name} store's driver is not installed: pip install {stores.DRIVERS[name]}",
        ),
    )
    for name in ("lmdb", "leveldb")
]

N = 300  # messages per test
KILLS = 3  # SIGKILLs per test, spread over the run
OPTS: dict[str, Any] = {"backoff": (0.05, 0.5), "reconnect_timeout": 60.0, "connect_timeout": 5.0}


class Crashes:
    """Starts the router and SIGKILLs / restarts it on the same port and store."""

    def __init__(self, router: Any, tmp_path: Path, store: str) -> None:
        self.factory = router
        self.port = free_port()
        self.args = ["--store", store, "--store-path", str(tmp_path / "store")]
        self.routers = [self._start(0)]

    def _start(self, n: int) -> Any:
        # a restarted router keeps its id: termini are keyed by container-ids (2.6.1), and a
        # router under another id is another container with none of these links
        return self.factory(
            f"r{n}", router_id="r", listeners=[{"port": self.port}], extra_args=self.args
        )

    @property
    def url(self) -> str:
        return f"amqp://127.0.0.1:{self.port}"

    async def crash_at(self, progress: Callable[[], int], seed: int) -> None:
        """Kill the router each time `progress()` passes the next of KILLS points."""
        rnd = random.Random(seed)
        loop = asyncio.get_running_loop()
        points = sorted(rnd.randint(N // 10, N - N // 10) for _ in range(KILLS))
        for k, at in enumerate(points, 1):
            await wait_until(
                lambda at=at: progress() >= at,
                60,
                lambda at=at, k=k: f"{at} processed (have {progress()}) before kill {k}",
            )
            await asyncio.sleep(rnd.uniform(0, 0.05))
            await loop.run_in_executor(None, self.routers[-1].kill)
            await asyncio.sleep(rnd.uniform(0, 0.3))
            self.routers.append(await loop.run_in_executor(None, self._start, k))


async def traffic(
    crashes: Crashes, exactly_once: bool, seed: int
) -> tuple[Counter[str], list[Outcome]]:
    tag = "eo" if exactly_once else "alo"
    producer = await Client.connect(crashes.url, f"{tag}-producer", **OPTS)
    consumer = await Client.connect(crashes.url, f"{tag}-consumer", **OPTS)
    processed: Counter[str] = Counter()
    try:
        rcv = await consumer.receiver(
            f"{tag}/orders", f"{tag}-in", exactly_once=exactly_once, credit=20
        )
        snd = await producer.sender(
            f"{tag}/orders", f"{tag}-out", exactly_once=exactly_once, max_in_flight=50
        )

        rnd = random.Random(seed)
        working: set[asyncio.Task[None]] = set()

        async def work(rec: Received) -> None:
            # the application's processing takes a while, concurrently: at any moment many
            # deliveries are yielded but not yet accepted, so every kill catches some
            await asyncio.sleep(rnd.uniform(0, 0.02))
            await rec.accept()

        async def consume() -> None:
            async for rec in rcv:
                processed[rec.message.body] += 1
                task = asyncio.create_task(work(rec))
                working.add(task)
                task.add_done_callback(working.discard)

        consuming = asyncio.create_task(consume())
        chaos = asyncio.create_task(crashes.crash_at(lambda: len(processed), seed))
        outcomes = await asyncio.wait_for(
            asyncio.gather(*(snd.send(Message(body=f"m{i}")) for i in range(N))), 150
        )
        await chaos
        await wait_until(
            lambda: len(processed) >= N,
            60,
            lambda: f"every message processed (have {len(processed)} of {N})",
        )
        # both ends settle everything (exactly-once: the router relays the settlement)
        await wait_until(
            lambda: rcv.unsettled == 0 and snd.unsettled == 0,
            30,
            lambda: f"nothing unsettled (receiver {rcv.unsettled}, sender {snd.unsettled})",
        )
        await asyncio.sleep(1.0)  # a late resend after the last restart would show here
        consuming.cancel()
        return processed, outcomes
    finally:
        await producer.close()
        await consumer.close()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("store", STORES)
def test_exactly_once_across_sigkill(router: Any, tmp_path: Path, store: str) -> None:
    crashes = Crashes(router, tmp_path, store)
    processed, outcomes = run(traffic(crashes, exactly_once=True, seed=1), timeout=240)
    assert len(crashes.routers) == KILLS + 1
    assert set(processed) == {f"m{i}" for i in range(N)}
    twice = {body: n for body, n in processed.items() if n != 1}
    assert not twice, f"processed more than once: {twice}"
    assert len(outcomes) == N and all(o.state == "accepted" for o in outcomes), Counter(
        o.state for o in outcomes
    )


@pytest.mark.timeout(300)
@pytest.mark.parametrize("store", STORES)
def test_at_least_once_across_sigkill(router: Any, tmp_path: Path, store: str) -> None:
    crashes = Crashes(router, tmp_path, store)
    processed, outcomes = run(traffic(crashes, exactly_once=False, seed=2), timeout=240)
    assert set(processed) == {f"m{i}" for i in range(N)}
    assert len(outcomes) == N and all(o.state == "accepted" for o in outcomes), Counter(
        o.state for o in outcomes
    )


def router_rows(url: str, entity: str) -> list[dict[str, Any]]:
    from qrouter_tools.management_client import ConnectOptions, ManagementClient

    with ManagementClient(ConnectOptions(url=url, timeout=5.0)) as c:
        return list(c.query(entity))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("store", STORES)
def test_held_before_forwarding_goes_out_after_restart(
    router: Any, tmp_path: Path, store: str
) -> None:
    """Deliveries the router held but had not sent on yet (in the address's queue: the
    consumer's credit was used up) when it was killed have records and no copies: once the producer resumes them after the
    restart they go out like new ones, and every one is accepted. (They used to stay held,
    unsettled, forever: found by test_at_least_once_across_sigkill under load.)"""
    crashes = Crashes(router, tmp_path, store)

    async def main() -> None:
        producer = await Client.connect(crashes.url, "held-producer", **OPTS)
        consumer = await Client.connect(crashes.url, "held-consumer", **OPTS)
        loop = asyncio.get_running_loop()
        try:
            rcv = await consumer.receiver("held/q", "held-in", credit=1)
            snd = await producer.sender("held/q", "held-out", max_in_flight=10)
            futs = [snd.submit(f"h{i}".encode()) for i in range(6)]
            first = await rcv.receive(timeout=10)
            assert first is not None

            async def waiting_in_router() -> bool:
                links = await loop.run_in_executor(None, router_rows, crashes.url, "link")
                addresses = await loop.run_in_executor(
                    None, router_rows, crashes.url, "router.address"
                )
                out = [r for r in links if r["name"] == "held-out"]
                queue = [r for r in addresses if r["name"] == "held/q"]
                return bool(out and queue and out[0]["unsettled"] == 6 and queue[0]["undelivered"])

            deadline = loop.time() + 10
            while not await waiting_in_router():
                assert loop.time() < deadline, "the router queues the rest, waiting for credit"
                await asyncio.sleep(0.1)
            await loop.run_in_executor(None, crashes.routers[-1].kill)
            crashes.routers.append(await loop.run_in_executor(None, crashes._start, 1))
            await first.accept()
            bodies = {first.message.body}
            while len(bodies) < 6:
                rec = await rcv.receive(timeout=20)
                assert rec is not None, f"only {sorted(bodies)} arrived"
                bodies.add(rec.message.body)
                await rec.accept()
            outcomes = await asyncio.wait_for(asyncio.gather(*futs), 30)
            assert all(o.accepted for o in outcomes), [o.state for o in outcomes]
            assert bodies == {f"h{i}".encode() for i in range(6)}
        finally:
            await producer.close()
            await consumer.close()

    run(main(), timeout=90)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("store", STORES)
def test_kill_right_after_accept(router: Any, tmp_path: Path, store: str) -> None:
    """The receiver accepts (exactly-once) and the router dies at once, before or after the
    sender heard: after the restart the sender still gets its outcome (from the router's
    unsettled map, Outcome.resumed, or a resumed delivery), both ends settle, and the
    message is not yielded a second time."""
    crashes = Crashes(router, tmp_path, store)

    async def main() -> None:
        producer = await Client.connect(crashes.url, "one-producer", **OPTS)
        consumer = await Client.connect(crashes.url, "one-consumer", **OPTS)
        try:
            rcv = await consumer.receiver("one/q", "one-in", exactly_once=True)
            snd = await producer.sender("one/q", "one-out", exactly_once=True)
            fut = snd.submit(b"only")
            rec = await rcv.receive(timeout=10)
            assert rec is not None and rec.message.body == b"only"
            await rec.accept()
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, crashes.routers[-1].kill)
            crashes.routers.append(await loop.run_in_executor(None, crashes._start, 1))
            assert (await asyncio.wait_for(fut, 30)).accepted
            await rec.wait_settled(30)
            with pytest.raises(TimeoutError):
                await rcv.receive(timeout=1.0)
            assert snd.unsettled == 0 and rcv.unsettled == 0
        finally:
            await producer.close()
            await consumer.close()

    run(main(), timeout=90)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("store", STORES)
def test_records_of_a_killed_router(router: Any, tmp_path: Path, store: str) -> None:
    """What a SIGKILLed router left in the store for messages a consumer holds unsettled: each
    producer delivery's record under an id of the router's (ascending, so batches append),
    with the producer's tag inside; each copy's record names that record as its origin."""
    from qrouter.stores.termini import load_termini

    crashes = Crashes(router, tmp_path, store)

    async def main() -> None:
        producer = await Client.connect(crashes.url, "rec-producer", **OPTS)
        consumer = await Client.connect(crashes.url, "rec-consumer", **OPTS)
        try:
            rcv = await consumer.receiver("rec/q", "rec-in", exactly_once=True)
            snd = await producer.sender("rec/q", "rec-out", exactly_once=True)
            for i in range(5):
                snd.submit(f"r{i}".encode())
            for _ in range(5):  # received, never accepted: held by the router
                assert await rcv.receive(timeout=10) is not None
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, crashes.routers[-1].kill)
        finally:
            await producer.close()
            await consumer.close()

    run(main(), timeout=40)
    with stores.open_store(store, str(tmp_path / "store")) as st:
        termini = {t.key.link_name: t for t in load_termini(st)}
    held_in, held_out = termini["rec-out"], termini["rec-in"]
    assert len(held_in.unsettled) == 5 and len(held_out.unsettled) == 5
    ids = list(held_in.unsettled)  # load order: key order
    assert all(len(i) == 8 for i in ids) and ids == sorted(set(ids))
    tags = {r.tag for r in held_in.unsettled.values()}  # the producer's, inside the records
    assert (
        None not in tags and len(tags) == 5 and all(r.message for r in held_in.unsettled.values())
    )
    origins = {held_in.key.digest + i for i in ids}
    assert {r.origin for r in held_out.unsettled.values()} == origins
