"""Backpressure between routers (issue 13): a stalled consumer behind a second router, and a
slow next hop. Inter-router connections have the same write-buffer marks as any other; the
per-address links on them add no capacity while their connection is paused, so the stall
travels upstream as credit (qrouter/_fast/backpressure.pxi, docs/mesh.md)."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from tests.clients import ThreadedRun
from tests.harness import MeshRouter, free_port, retry
from tests.interop.test_backpressure import stall_and_drain
from tests.management.tooling import ok
from tests.mesh_system.mesh import Traffic, mesh
from tests.stalled import rss_kib


@pytest.mark.timeout(400)
def test_stalled_consumer_behind_another_router(router: Any) -> None:
    """Producer on A, the raw consumer that stops reading on B: neither router buffers the
    stream; every message arrives in order when the consumer reads again."""
    r = mesh(router, [("A", "B")], ["A", "B"])
    stall_and_drain([r["A"], r["B"]], r["A"].url, r["B"].port, "bp.hop", settled=True)


def granted_to_producer(a: Any) -> int:
    """All the credit router A has granted the producer's link: transfers it took plus
    credit left (2.6.7: delivery-count + link-credit)."""
    rows = [
        row
        for row in ok("links", "--url", a.url, "--json").json()
        if row["direction"] == "in" and row["address"] == "bp.slowhop"
    ]
    assert len(rows) == 1, rows
    return int(rows[0]["delivery_count"]) + int(rows[0]["credit"])


@pytest.mark.timeout(300)
def test_slow_next_hop_pauses_the_inter_router_connection(router: Any) -> None:
    """B is frozen (SIGSTOP: it reads nothing) while A streams 150 KB messages to a consumer
    behind it, and B has granted A credit for more than the kernel's socket buffers hold
    (B's link capacity 500: 75 MB; loopback buffers here take up to ~36 MB): A's connection
    to B passes its high-water mark and is paused, A grants its producer nothing more
    meanwhile, and once B runs again the connection resumes and every message is accepted.
    B stays frozen for less than the 16 s idle time-out."""
    common = {"write_buffer_high": 65536, "write_buffer_low": 16384, "hello_max_age": 30.0}
    port_a = free_port()
    a = router("A", cls=MeshRouter, inter_port=port_a, config=common)
    b = router("B", cls=MeshRouter, connect=[port_a], config={**common, "link_capacity": 500})
    n = 800
    run = ThreadedRun(Traffic(a.url, [b.url], "bp.slowhop", n, pad=150_000), timeout=200)
    h: Traffic = run.handler  # type: ignore[assignment]
    run.start()
    retry(lambda: len(h.accepted) >= 20, timeout=30, message=lambda: f"{len(h.accepted)} accepted")
    before = rss_kib(a.pid)
    b.send_signal(signal.SIGSTOP)
    try:
        rows: list[dict[str, Any]] = []

        def paused() -> bool:
            rows[:] = [
                row
                for row in ok("connections", "--url", a.url, "--json").json()
                if row["role"] == "inter-router"
            ]
            return bool(rows) and rows[0]["write_paused"] is True

        retry(paused, timeout=8, message=lambda: f"A's inter-router connection: {rows}")
        granted = granted_to_producer(a)
        time.sleep(1.0)
        assert granted_to_producer(a) == granted, "A granted credit while its next hop paused"
        # what A holds meanwhile is bounded by credit: its producer's at its last top-up
        # (A's link capacity, 250) plus what already waited then (a top-up needs spare
        # credit from the consumer side, here the 500 B granted A's qr.bp.slowhop link)
        held = [
            row["undelivered"]
            for row in ok("addresses", "--url", a.url, "--json").json()
            if row["name"] == "bp.slowhop"
        ]
        assert held and held[0] <= 250 + 500, held
        after = rss_kib(a.pid)
        print(
            f"\nA: VmRSS {before / 1024:.1f} -> {after / 1024:.1f} MiB while B is frozen, "
            f"holding {held[0]} of the producer's messages"
        )
    finally:
        b.send_signal(signal.SIGCONT)
    run.join(200)
    assert len(h.accepted) == n
    assert sorted(h.received[0]) == list(range(n))
    rows = [
        row
        for row in ok("connections", "--url", a.url, "--json").json()
        if row["role"] == "inter-router"
    ]
    assert rows and rows[0]["write_paused"] is False and rows[0]["write_pauses"] >= 1
