"""Client API tests: the asyncio client (qrouter/client.py) against real router processes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

# Every client test is bounded even without its own mark (pytest-timeout); the tests' own
# waits (asyncio.wait_for) are shorter.
DEFAULT_TEST_TIMEOUT = 120


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/client/" in item.nodeid and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(DEFAULT_TEST_TIMEOUT))


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
