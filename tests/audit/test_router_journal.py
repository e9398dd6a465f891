"""A real router journals its deliveries (--journal DIR) and `qrouter-tool audit` reads the
journal back in local Spark: counts, outcome totals, latency within what the test measured,
plots and report.html."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from proton import Message
from proton.utils import BlockingConnection, SendException

pytest.importorskip("pyarrow")

N = 300  # messages: every 7th rejected, every 11th (not 7th) released, the rest accepted


def expected(i: int) -> str:
    if i % 7 == 0:
        return "rejected"
    if i % 11 == 0:
        return "released"
    return "accepted"


def test_router_journal_audited(router: Any, spark: Any, tmp_path: Path) -> None:
    from qrouter_tools.audit.job import run_audit

    journal = tmp_path / "journal"
    r = router(extra_args=["--journal", str(journal)])
    consumer = BlockingConnection(r.url, timeout=10)
    receiver = consumer.create_receiver("audited", credit=50)
    outcomes: list[Any] = []
    t0 = time.time_ns()

    def produce() -> None:
        producer = BlockingConnection(r.url, timeout=10)
        sender = producer.create_sender("audited")
        for i in range(N):
            try:
                outcomes.append(sender.send(Message(body=f"m{i}"), timeout=10).remote_state)
            except SendException as e:  # proton's way of reporting any outcome but accepted
                outcomes.append(e.state)
        producer.close()

    thread = threading.Thread(target=produce)
    thread.start()
    for i in range(N):
        m = receiver.receive(timeout=10)
        assert m.body == f"m{i}"
        {
            "accepted": receiver.accept,
            "rejected": receiver.reject,
            "released": lambda: receiver.release(delivered=False),
        }[expected(i)]()
    consumer.close()
    thread.join(20)
    assert not thread.is_alive() and len(outcomes) == N
    elapsed_ns = time.time_ns() - t0
    r.stop()  # SIGTERM: the writer publishes its last segment

    assert list(journal.glob("*.parquet")), "no journal segment was written"
    summary = run_audit(
        [str(journal)], str(tmp_path / "out"), spark=spark, progress=lambda *a: None
    )
    (a,) = [x for x in summary["by_address"] if x["address"] == "audited"]
    want = {
        o: sum(1 for i in range(N) if expected(i) == o)
        for o in ("accepted", "rejected", "released")
    }
    assert a["published"] == N
    # the audit counts a delivery forwarded then released back as not delivered
    assert a["delivered"] == N - want["released"]
    assert {k: v for k, v in a["outcomes"].items() if v} == want
    assert {k: v for k, v in a["publisher_outcomes"].items() if v} == want
    lat = a["in_router_latency"]
    assert N - want["released"] <= lat["count"] <= N
    assert 0 < lat["min_ns"] <= lat["p50_ns"] <= lat["p99_ns"] <= lat["max_ns"] <= elapsed_ns
    rtt = a["edge_round_trip"]  # every publish got its outcome back, released ones too
    assert rtt["count"] == N
    assert 0 < rtt["min_ns"] <= rtt["p50_ns"] <= rtt["p99_ns"] <= rtt["max_ns"] <= elapsed_ns
    assert summary["unsettled"]["count"] == 0
    out = tmp_path / "out"
    assert (out / "report.html").stat().st_size > 1000
    assert (out / "throughput.png").exists() and (out / "latency.png").exists()
    assert json.loads((out / "summary.json").read_text())["rows"] == summary["rows"]
