"""qrouter/heap_trim.py: free heap pages go back to the system, and the router's loop does it."""

from __future__ import annotations

import asyncio
import time
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


def test_a_slow_pass_puts_the_next_one_off() -> None:
    """A pass blocks the loop: one that took 5 ms is not followed by another for 5 s, so
    trimming a large heap takes at most 0.1% of the loop's time."""
    assert heap_trim.next_delay(1.0, 0.0002) == 1.0
    assert heap_trim.next_delay(1.0, 0.005) == pytest.approx(5.0)
    assert heap_trim.next_delay(0.01, 0.001) == pytest.approx(1.0)


@needs_glibc
def test_the_loop_spaces_slow_passes() -> None:
    delays: list[float] = []

    def slow(pad: int) -> int:
        time.sleep(0.002)
        return 0

    async def main() -> None:
        loop = asyncio.get_running_loop()
        real = loop.call_later

        def spy(delay: float, cb: object, *args: object) -> asyncio.TimerHandle:
            if getattr(cb, "__name__", "") == "tick":  # not the test's own sleeps
                delays.append(delay)
            return real(min(delay, 0.01), cb, *args)  # type: ignore[arg-type]

        with mock.patch.object(loop, "call_later", spy):
            heap_trim.start(interval=0.01)
            for _ in range(500):  # bounded: 5 s at most
                if len(delays) >= 3:
                    break
                await asyncio.sleep(0.01)

    with mock.patch.object(heap_trim, "MALLOC_TRIM", side_effect=slow):
        asyncio.run(main())
    assert delays[0] == 0.01  # the first pass: the interval
    assert all(d >= 2.0 for d in delays[1:3]), delays  # after a 2 ms pass: 2 s at least
