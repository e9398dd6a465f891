"""The mesh's ticker task (qrouter/inter_router.py, `Mesh._ticker`): a tick that raises is
logged and the task goes on, since a router whose ticker ended would send no more HELLOs and
its neighbours would drop it, with nothing said until it exits."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from qrouter.inter_router import Mesh, Peer
from tests.engine.pump import make_core


def test_a_tick_that_raises_does_not_end_the_ticker() -> None:
    mesh = Mesh(make_core(id="B"))
    ticks: list[float] = []
    tick = mesh.engine.tick

    def failing_once(now: float) -> None:
        ticks.append(now)
        if len(ticks) == 1:
            raise RuntimeError("a bug in the routing engine")
        tick(now)

    mesh.engine.tick = failing_once  # type: ignore[method-assign]

    async def run() -> None:
        mesh.start(lambda cc: None)  # (no connectors configured)
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10.0
            while len(ticks) < 3 and loop.time() < deadline:
                await asyncio.sleep(0.05)
        finally:
            mesh.stop()

    asyncio.run(run())
    assert len(ticks) >= 3, ticks  # ticking after the first failed


def test_a_per_address_link_the_neighbour_detached_is_applied_within_a_tick() -> None:
    """Before the ticker slept until something was due, a fixed tick every TICK applied the
    address of a per-address link the neighbour detached (reopened, or let go): it still is
    within TICK, not at the next HELLO (up to a second later)."""
    mesh = Mesh(make_core(id="B"))
    ticks: list[float] = []
    tick = mesh.engine.tick

    def counted(now: float) -> None:
        ticks.append(now)
        tick(now)

    mesh.engine.tick = counted  # type: ignore[method-assign]
    conn = SimpleNamespace(conn_id=7, closed=False, info=None)
    peer = Peer(conn, "A", 1)  # type: ignore[arg-type]
    conn.info = peer
    link = object()
    peer.xlinks["service"] = link  # type: ignore[assignment]
    mesh.xlink_count["service"] = 1
    waited: list[float] = []

    async def run() -> None:
        loop = asyncio.get_running_loop()
        mesh.start(lambda cc: None)
        try:
            deadline = loop.time() + 10.0
            while (mesh._sleep is None or not ticks) and loop.time() < deadline:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)  # (well inside the idle ticker's sleep of a second)
            n, t0 = len(ticks), loop.time()
            mesh.on_detach(conn, link)  # type: ignore[arg-type]
            while len(ticks) == n and loop.time() < deadline:
                await asyncio.sleep(0.01)
            waited.append(loop.time() - t0)
        finally:
            mesh.stop()

    asyncio.run(run())
    assert "service" not in peer.xlinks
    assert waited and waited[0] < 0.5, waited  # TICK is 0.1 s; the idle sleep 1 s
