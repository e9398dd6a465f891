"""qrouter/heap_trim.py: free heap pages go back to the system, and the router's loop does it."""

from __future__ import annotations

import asyncio
from unittest import mock

import pytest

from qrouter import heap_trim

needs_glibc = pytest.mark.skipif(
    heap_trim.MALLOC_TRIM is None, reason="this C library has no malloc_trim (not glibc)"
)


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


@needs_glibc
def test_trim_gives_back_the_free_pages_inside_the_heap() -> None:
    """A burst of 2 KiB blocks (malloc's heap, not Python's small-object arenas) of which one
    in 50 stays: the freed runs between the survivors are whole pages glibc keeps resident
    until a trim, since they are not at the top of the heap."""
    heap_trim.trim()
    burst = [bytes(2048) for _ in range(20_000)]  # about 40 MiB
    kept = burst[::50]
    del burst
    before = rss_kib()
    assert heap_trim.trim()
    after = rss_kib()
    assert before - after > 16 * 1024, (before, after)
    assert len(kept) == 400


@needs_glibc
def test_start_trims_on_the_running_loop() -> None:
    calls: list[int] = []

    async def main() -> bool:
        on = heap_trim.start(interval=0.01)
        for _ in range(500):  # bounded: 5 s at most
            if len(calls) >= 2:
                break
            await asyncio.sleep(0.01)
        return on

    with mock.patch.object(
        heap_trim, "MALLOC_TRIM", side_effect=lambda pad: calls.append(pad) or 0
    ):
        assert asyncio.run(main())
    assert calls[:2] == [0, 0]


def test_start_is_off_without_malloc_trim() -> None:
    async def main() -> bool:
        return heap_trim.start(interval=0.01)

    with mock.patch.object(heap_trim, "MALLOC_TRIM", None):
        assert asyncio.run(main()) is False
        assert heap_trim.trim() is False
