"""The guaranteed topics' clock (EoLinks.c_now): under uvloop it is read in C, not through
`loop.time()`, and must still be the loop's own time: the ticker and the Python side compare
their deadlines with `loop.time()`, the per-message inputs with c_now."""

from __future__ import annotations

import asyncio
import time

import uvloop
from qrouter._fast.engine import EoLinks


def _bracketed(loop: asyncio.AbstractEventLoop, rounds: int = 50) -> None:
    g = EoLinks()
    g.loop = loop
    for i in range(rounds):
        before = loop.time()
        now = g.now()
        after = loop.time()
        assert before <= now <= after, (i, before, now, after)
        if i % 10 == 9:
            time.sleep(0.0031)  # cross a millisecond boundary (uvloop's resolution)


def test_uvloop_time_read_in_c_is_the_loops_own() -> None:
    loop = uvloop.new_event_loop()
    try:
        _bracketed(loop)
    finally:
        loop.close()


def test_another_loop_is_asked_for_its_time() -> None:
    loop = asyncio.new_event_loop()
    try:
        _bracketed(loop)
    finally:
        loop.close()


def test_a_loop_whose_time_is_overridden_is_asked() -> None:
    class Shifted(uvloop.Loop):  # type: ignore[misc,name-defined]
        def time(self) -> float:
            return super().time() + 1000.0

    loop = Shifted()
    try:
        g = EoLinks()
        g.loop = loop
        assert g.now() >= loop.time() - 1.0 > 999.0
        _bracketed(loop)
    finally:
        loop.close()
