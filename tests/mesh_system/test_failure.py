"""Router loss, restart, refusals (docs/mesh.md, "Failure")."""

from __future__ import annotations

import time
from typing import Any

import pytest
from proton import ConnectionException
from proton.utils import BlockingConnection

from tests.clients import ThreadedRun, run_container
from tests.harness import MeshRouter, free_port, retry
from tests.mesh_system.mesh import Traffic, mesh, wait_log

# Measured bound (docs/mesh.md): traffic A->D resumes via C this soon after B is SIGKILLed
FAILOVER_BOUND = 3.0


def test_square_router_killed_traffic_resumes_via_the_other_path(router: Any) -> None:
    # A-B-D-C-A; A reaches D via B (equal costs, the lower id wins the tie)
    r = mesh(router, [("A", "B"), ("A", "C"), ("B", "D"), ("C", "D")], ["A", "B", "C", "D"])
    n = 3000
    run = ThreadedRun(
        Traffic(r["A"].url, [r["D"].url], "square.q", n, resend=True, pace=0.002, window=50),
        timeout=90,
    ).start()
    handler: Traffic = run.handler  # type: ignore[assignment]
    retry(lambda: len(handler.accepted) > 300, timeout=30, message=handler.progress)
    killed_at = time.monotonic()
    r["B"].kill()
    t = run.join()
    assert t is handler
    # every message arrived (MODIFIED ones may have arrived twice: at-least-once for them)
    got = [i for rcv in t.received for i in rcv]
    assert set(got) == set(range(n)), "nothing is missing after the sender resent"
    dupes = len(got) - len(set(got))
    assert dupes <= t.modified
    # traffic resumed: the first acceptance of a message sent (or resent) after the kill
    after = sorted(ts for ts, i in t.accept_times if t.sent_times[i] > killed_at)
    assert after, "traffic resumed"
    resumed = after[0] - killed_at
    print(
        f"\nresumed {resumed * 1000:.0f} ms after the kill; released {t.released}, "
        f"modified {t.modified}, duplicates {dupes}"
    )
    assert resumed < FAILOVER_BOUND
    assert t.released + t.modified > 0, "in-flight deliveries came back to the sender"


def test_restarted_router_rejoins_and_receives(router: Any) -> None:
    r = mesh(router, [("A", "B")], ["A", "B"])
    run_container(Traffic(r["A"].url, [r["B"].url], "rejoin.q", 100), timeout=30)
    port = r["B"].inter_port
    r["B"].kill()
    # same id, same inter-router port; A's connector finds it again (backoff at most 2 s)
    b2 = router("B2", cls=MeshRouter, router_id="B", inter_port=port, connect=[r["A"].inter_port])
    t = run_container(Traffic(r["A"].url, [b2.url], "rejoin.q", 100), timeout=30)
    assert t.received[0] == list(range(100))


def test_client_refused_on_inter_router_listener(router: Any) -> None:
    r = mesh(router, [], ["A"])
    with pytest.raises(ConnectionException) as exc:
        conn = BlockingConnection(f"amqp://127.0.0.1:{r['A'].inter_port}", timeout=10)
        conn.create_sender("x")
    assert "inter-router" in str(exc.value)


def test_router_refused_on_normal_listener(router: Any) -> None:
    a = router("A", cls=MeshRouter)
    x = router("X", cls=MeshRouter, connect=[a.port])  # connects to A's *normal* listener
    wait_log(a, "inter-router connections are accepted only on an inter-router listener")
    assert x.poll() is None


def test_duplicate_router_id_refused(router: Any) -> None:
    a = router("A", cls=MeshRouter)
    # a second router with A's own id
    router("A2", cls=MeshRouter, router_id="A", connect=[a.inter_port])
    wait_log(a, "duplicate router id 'A'")
    # two routers both called B: A takes the first and refuses the other
    router("B", cls=MeshRouter, connect=[a.inter_port])
    time.sleep(0.5)
    router("B-again", cls=MeshRouter, router_id="B", connect=[a.inter_port])
    wait_log(a, "refusing router 'B'")


def test_inter_router_port_reused_at_once_after_kill(router: Any) -> None:
    port = free_port()
    a = router("A", cls=MeshRouter, inter_port=port)
    b = router("B", cls=MeshRouter, connect=[port])
    wait_log(a, "neighbour 'B' up")
    a.kill()
    router("A2", cls=MeshRouter, router_id="A", inter_port=port)
    wait_log(b, f"connector 127.0.0.1:{port}: connected")
