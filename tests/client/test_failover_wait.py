"""Failover waits for the old connection to be over (docs/exactly-once.md, decision 6).

A link must be attached at one router at a time. When the client loses a connection without
the router confirming its end (the router stopped answering: a half-open connection), the
router may still hold the client's links until its own idle timeout closes the connection;
the client resumes them elsewhere only after that. When the router closes cleanly (CLOSE, or
its socket goes), the client resumes at once.

The half-open case is made with SIGSTOP: router A stops reading while its socket stays open.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

from qrouter.client import Client
from tests.client.conftest import run, wait_until

OPTS: dict[str, Any] = {"backoff": (0.05, 0.2), "reconnect_timeout": 60.0, "connect_timeout": 1.0}


async def _failover(a: Any, b: Any, freeze: bool) -> tuple[float, float, Client]:
    """A client with a durable sender at A; A is frozen (SIGSTOP) or stopped (SIGTERM);
    returns (seconds from then until the sender is attached at B, A's advertised
    idle-time-out, the client)."""
    client = await Client.connect([a.url, b.url], "failover-wait", idle_timeout=1.0, **OPTS)
    sender = await client.sender("events", "out")
    assert client.url == a.url and sender.attached
    advertised = client.conn.remote_idle_timeout_ms / 1000.0
    t0 = time.monotonic()
    if freeze:
        os.kill(a.pid, signal.SIGSTOP)
    else:
        a.stop()
    try:
        await wait_until(
            lambda: client.url == b.url and sender.attached,
            40.0,
            lambda: f"the sender re-attached at B (url {client.url}, resume_at {client.resume_at})",
        )
        return time.monotonic() - t0, advertised, client
    finally:
        if freeze:
            os.kill(a.pid, signal.SIGCONT)


def test_half_open_connection_waits_for_the_idle_timeout(router: Any) -> None:
    # A closes a connection it has not heard from for 3 s (it advertises 1.5 s, 2.4.5)
    a = router("A", listeners=[{"idle_timeout": 3.0}])
    b = router("B")

    async def main() -> None:
        took, advertised, client = await _failover(a, b, freeze=True)
        assert advertised == 1.5
        # the client notices after its own idle timeout (1 s), then waits A's real
        # threshold (2 x 1.5 s) + 1 s: A has surely dropped the connection by then
        print(f"half-open: resumed at B {took:.2f} s after A froze")
        assert took >= 2 * advertised + 1.0, f"resumed at B {took:.2f} s after A froze"
        assert client.connects == 2
        await client.close()

    run(main(), 60)


def test_half_open_same_router_again_resumes_at_once(router: Any) -> None:
    """Back on the router that held the old connection, the router itself ends the old
    attachment when the link attaches again (link stealing): no wait."""
    a = router("A", listeners=[{"idle_timeout": 60.0}])

    async def main() -> None:
        client = await Client.connect([a.url], "failover-same", idle_timeout=1.0, **OPTS)
        sender = await client.sender("events", "out")
        os.kill(a.pid, signal.SIGSTOP)
        try:
            await wait_until(
                lambda: client.resume_at is not None, 10.0, lambda: "the client noticing"
            )
        finally:
            os.kill(a.pid, signal.SIGCONT)
        held = client.resume_at
        assert held is not None and held - asyncio.get_running_loop().time() > 60
        await wait_until(lambda: sender.attached, 20.0, lambda: "the sender re-attached at A")
        assert client.resume_at is None
        await client.close()

    run(main(), 60)


def test_clean_close_resumes_at_once(router: Any) -> None:
    # a long idle timeout: waiting for it would take 2 x 30 + 1 s
    a = router("A", listeners=[{"idle_timeout": 60.0}])
    b = router("B")

    async def main() -> None:
        took, advertised, client = await _failover(a, b, freeze=False)
        assert advertised == 30.0
        assert client.resume_at is None
        print(f"clean close: resumed at B {took:.2f} s after A stopped")
        assert took < 20.0, f"resumed at B {took:.2f} s after A stopped"
        await client.close()

    run(main(), 60)
