"""Client API tests: the asyncio client (qrouter/client.py) against real router processes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from tests.conftest import DEFAULT_TIMEOUTS

T = TypeVar("T")

DEFAULT_TEST_TIMEOUT = DEFAULT_TIMEOUTS["client"]  # tests/conftest.py


def run(coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
    """Run one test coroutine on a fresh event loop, bounded by `timeout` seconds."""

    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


async def wait_until(pred: Callable[[], bool], timeout: float, what: Callable[[], str]) -> None:
    """Until `pred()` holds, checked every 20 ms; fails after `timeout` seconds saying what()."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what()}")
        await asyncio.sleep(0.02)
