"""Give the C heap's free pages back to the system every few seconds (glibc's malloc_trim).

What a burst leaves: the records, tables and buffers of the messages in flight are freed
when they settle, but glibc's allocator keeps freed memory that is not at the top of its
heap resident, so each burst that reaches further into the heap than the last raises the
RSS for good. Measured on the exactly-once RSS bench (memory store, triangle, rounds of
100,000 messages), 2026-11-26, after the engine stopped keeping closed connections in
reference cycles: the bytes malloc had in use stayed flat (5.5-6.7 MiB on B and C over
7 rounds) while its free bytes inside the heap grew from 3.0 to 4.4 MiB on B, and the RSS
with them. `malloc_trim(0)` hands the whole free pages among those back (madvise), so the RSS
follows what is in use. A pass walks the allocator's free chunks: well under a millisecond
on a router's heap of a few tens of MiB, once every TRIM_INTERVAL_S. A pass blocks the loop,
and its cost grows with the heap (a router that buffered a large backlog), so the interval
grows with it: the next pass comes no sooner than TRIM_SHARE_INVERSE times the last one's
duration later (at most 0.1% of the loop's time goes to trimming).

Other C libraries (musl, macOS) have no malloc_trim: there this does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import time
from collections.abc import Callable

TRIM_INTERVAL_S = 1.0
TRIM_SHARE_INVERSE = 1000  # a pass that took t seconds: the next one no sooner than 1000 t later


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


MALLOC_TRIM = _malloc_trim()


def trim() -> bool:
    """One pass now: whether memory went back to the system (False: none, or no glibc)."""
    return bool(MALLOC_TRIM(0)) if MALLOC_TRIM is not None else False


def next_delay(interval: float, took: float) -> float:
    """Seconds until the next pass, after one that took `took` seconds."""
    return max(interval, took * TRIM_SHARE_INVERSE)


def start(interval: float = TRIM_INTERVAL_S) -> bool:
    """Trim every `interval` seconds on the running loop for as long as it runs; whether
    trimming is on (False without malloc_trim)."""
    if MALLOC_TRIM is None:
        return False
    loop = asyncio.get_running_loop()

    def tick() -> None:
        t0 = time.perf_counter()
        trim()
        loop.call_later(next_delay(interval, time.perf_counter() - t0), tick)

    loop.call_later(interval, tick)
    return True
