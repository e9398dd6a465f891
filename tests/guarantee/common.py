"""Clients of guaranteed topics for the tests: publishers and subscribers on our client API
(router/client.py), which resume their links after a failover, and what they saw."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from router.client import Client, Message, Outcome

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


async def wait_until(pred: Callable[[], bool], timeout: float, what: Callable[[], str]) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        if loop.time() > deadline:
            raise AssertionError(f"not within {timeout}s: {what()}")
        await asyncio.sleep(0.05)


def topic_rows(url: str) -> list[dict[str, Any]]:
    """The routers's guaranteed topics (management QUERY of type topic); blocking."""
    from qrouter_tools.management_client import ConnectOptions, ManagementClient

    with ManagementClient(ConnectOptions(url=url, timeout=5.0)) as c:
        return c.query("topic")


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
