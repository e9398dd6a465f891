"""The audit's latencies agree with what the clients measure around the same messages (issue
16 item 9, issue 18 item 4; docs/journal.md "How the audit's latencies relate to the bench's").

One router with --journal, a proton producer that times each send from before it hands the
message over to after its outcome is back (its round trip), and a consumer that takes the
producer's send time from the body (the one-way latency, as tools/bench measures it). The
router's clock and the clients' are the same (CLOCK_REALTIME on one machine), and for every
message the journal's times fall inside the clients':

    producer send <= received <= forwarded <= consumer's receive
    received <= outcome back to the producer <= the producer sees its outcome

so per message: in-router <= edge round trip <= the producer's round trip, and in-router <=
one-way. What holds per message holds for every order statistic (the k-th smallest of one
list is at most the k-th smallest of a list that dominates it element by element), so the
audit's min, p50, p99 and max are compared with the clients' at the same (or a higher) rank.
Nothing here asserts a speed: only the ordering the definitions imply.
"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from proton import Message
from proton.utils import BlockingConnection

pytest.importorskip("pyarrow")

N = 200


def rank(values: list[int], p: float) -> int:
    """The client's figure to compare with the audit's percentile p: one rank above the
    nearest rank, so Spark's approximate percentile (rank error below one here) is covered."""
    ordered = sorted(values)
    return ordered[min(len(ordered), math.ceil(p * len(ordered)) + 1) - 1]


def test_audit_latencies_sit_inside_what_the_clients_measured(
    router: Any, spark: Any, tmp_path: Path
) -> None:
    from qrouter_tools.audit.job import run_audit

    journal = tmp_path / "journal"
    r = router(extra_args=["--journal", str(journal)])
    consumer = BlockingConnection(r.url, timeout=10)
    receiver = consumer.create_receiver("timed", credit=20)
    one_way: list[int] = []
    round_trip: list[int] = []
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            producer = BlockingConnection(r.url, timeout=10)
            sender = producer.create_sender("timed")
            for i in range(N):
                t_send = time.time_ns()
                sender.send(Message(body={"i": i, "t": t_send}), timeout=10)  # waits: settled
                round_trip.append(time.time_ns() - t_send)
            producer.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            errors.append(exc)

    thread = threading.Thread(target=produce)
    thread.start()
    for i in range(N):
        m = receiver.receive(timeout=10)
        one_way.append(time.time_ns() - m.body["t"])
        assert m.body["i"] == i
        receiver.accept()
    consumer.close()  # proton sends the last accept as it closes
    thread.join(20)
    assert not errors and not thread.is_alive(), errors
    assert len(round_trip) == len(one_way) == N
    r.stop()  # SIGTERM: the writer publishes its last segment

    summary = run_audit(
        [str(journal)], str(tmp_path / "out"), spark=spark, progress=lambda *a: None
    )
    (a,) = [x for x in summary["by_address"] if x["address"] == "timed"]
    (per_router,) = summary["by_router"]
    in_router, edge = a["in_router_latency"], a["edge_round_trip"]
    # one router: the per-address figures are its per-router ones
    assert per_router["transit_latency"]["count"] == in_router["count"] == N
    assert per_router["edge_round_trip"] == edge and edge["count"] == N
    print(  # shown with -s: the four figures side by side
        f"p50 in-router {in_router['p50_ns']} ns, edge round trip {edge['p50_ns']} ns, "
        f"client one-way {rank(one_way, 0.5)} ns, client round trip {rank(round_trip, 0.5)} ns"
    )
    for key, p in (("min_ns", 0.0), ("p50_ns", 0.5), ("p99_ns", 0.99), ("max_ns", 1.0)):
        assert 0 < in_router[key] <= edge[key], key
        assert per_router["transit_latency"][key] <= edge[key], key
        # what the audit sees is inside what the clients saw, message by message
        client_rtt = min(round_trip) if p == 0.0 else rank(round_trip, p)
        client_one_way = min(one_way) if p == 0.0 else rank(one_way, p)
        assert edge[key] <= client_rtt, (key, edge[key], client_rtt)
        assert in_router[key] <= client_one_way, (key, in_router[key], client_one_way)
