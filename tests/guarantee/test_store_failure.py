"""A guaranteed topic whose store commits fail (issue 13 point 5, issue 15 item d;
qrouter/guarantee.py, qrouter/store_health.py).

The test hook QROUTER_TEST_STORE_FAIL makes every store commit fail with ENOSPC while a flag
file exists. While it does, the topic's state machine may not go on as if its records were
stored: nothing it decided reaches a client (no delivery to the subscriber, no outcome to the
publisher). When the file goes, the held records are committed and everything goes out; if
the router is SIGKILLed while failing, the restarted router has only what was stored, the
clients resume, and every message arrives exactly once with its body — never an empty one.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from qrouter import stores
from qrouter.client import Message as ClientMessage
from qrouter.client import Outcome
from tests.client.conftest import run
from tests.guarantee.common import (
    accept_all,
    lmdb_topic_router,
    subscriber_then_publisher,
    wait_until,
)
from tests.harness import free_port

TOPIC = "events"
SLOW = {"backoff": (0.5, 1.0), "reconnect_timeout": 60.0, "connect_timeout": 3.0}


@pytest.mark.skipif(not stores.available("lmdb"), reason="needs the lmdb store: pip install lmdb")
def test_failing_commits_hold_the_topic_and_lose_no_body(
    router: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flag = tmp_path / "store-full"
    monkeypatch.setenv("QROUTER_TEST_STORE_FAIL", str(flag))
    port = free_port()

    def start(name: str) -> Any:
        return lmdb_topic_router(router, name, port, tmp_path / "store")

    r = start("r0")
    url = r.url

    async def scenario() -> None:
        subc, receiver, pubc, sender = await subscriber_then_publisher(url, 50, **SLOW)
        bodies: list[str] = []

        task = accept_all(receiver, bodies)

        async def publish(first: int, n: int) -> list[asyncio.Future[Outcome]]:
            return [sender.submit(ClientMessage(body=f"m{i}")) for i in range(first, first + n)]

        async def held(futs: list[asyncio.Future[Outcome]], seen: int) -> None:
            await asyncio.sleep(2.0)
            assert not any(f.done() for f in futs), "an outcome left with its records unstored"
            assert len(bodies) == seen, f"a delivery left with its records unstored: {bodies}"
            r.check_running()

        futs = await publish(0, 3)  # a working store
        assert all(o.accepted for o in await asyncio.wait_for(asyncio.gather(*futs), 20))
        await wait_until(lambda: len(bodies) == 3, 10, lambda: f"bodies {bodies}")

        flag.touch()  # a transient failure: held, then everything goes out
        futs = await publish(3, 3)
        await held(futs, 3)
        flag.unlink()
        assert all(o.accepted for o in await asyncio.wait_for(asyncio.gather(*futs), 30))
        await wait_until(lambda: len(bodies) == 6, 10, lambda: f"bodies {bodies}")

        flag.touch()  # a failure the router does not survive: only what was stored counts
        futs = await publish(6, 3)
        await held(futs, 6)
        r.kill()
        flag.unlink()
        await asyncio.to_thread(start, "r1")
        outcomes = await asyncio.wait_for(asyncio.gather(*futs), 60)
        assert all(o.accepted for o in outcomes), [o.state for o in outcomes]
        await wait_until(lambda: len(bodies) >= 9, 20, lambda: f"bodies {bodies}")
        await asyncio.sleep(0.5)  # a duplicate would come now
        task.cancel()
        await pubc.close()
        await subc.close()
        assert sorted(bodies, key=lambda b: int(b[1:])) == [f"m{i}" for i in range(9)], bodies

    run(scenario(), timeout=150)
