"""A journalled mesh carrying a guaranteed topic is audited as one (issues 5 and 7): three
routers in a triangle, each with --journal; one publisher, a subscriber on every router; the
audit joins the rows of the three journals by origin and gives the exactly-once verdict."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.client.conftest import run
from tests.guarantee.common import (
    TOPIC,
    Publisher,
    Routers,
    Subscriber,
    check_exactly_once,
    drained,
    wait_subscribers_known,
)

pytest.importorskip("pyarrow")

N = 150


def test_mesh_journals_give_the_exactly_once_verdict(
    router: Any, spark: Any, tmp_path: Path
) -> None:
    from qrouter_tools.audit.job import run_audit

    journals = {n: tmp_path / f"journal-{n}" for n in "ABC"}
    tri = Routers(router, extra_args=lambda name: ["--journal", str(journals[name])])

    async def scenario() -> None:
        subs = [await Subscriber.start([tri.url(n)], f"sub-{n}", TOPIC) for n in tri.names]
        await wait_subscribers_known(tri, len(subs))
        pub = await Publisher.start([tri.url("A")], "pub-A", TOPIC)
        await pub.publish(N)
        await drained(tri, [pub], subs, 30)
        check_exactly_once([pub], subs)
        for c in [pub, *subs]:
            await c.close()

    run(scenario(), timeout=90)
    for r in tri.r.values():
        r.stop()  # SIGTERM: each writer publishes its last segment
    for n, d in journals.items():
        assert json.loads((d / "guarantees.json").read_text()) == {TOPIC: "exactly-once"}, n
    summary = run_audit(
        [str(d) for d in journals.values()],
        str(tmp_path / "out"),
        spark=spark,
        progress=lambda *a: None,
    )
    verdict = summary["verdicts"][TOPIC]
    assert verdict["verdict"] == "pass", verdict
    (a,) = [x for x in summary["by_address"] if x["address"] == TOPIC]
    assert a["published"] == N
    assert a["delivered"] == 3 * N, "each of the 3 subscribers got each message once"


def test_mesh_journals_join_by_origin_for_plain_addresses(
    router: Any, spark: Any, tmp_path: Path
) -> None:
    # A - B: a proton producer on A, the consumer on B; B journals the origin A gave each
    # delivery (x-opt-qr-origin, added when the journal is on), so the audit joins them
    from proton import Message, Timeout
    from proton.utils import BlockingConnection
    from qrouter_tools.audit.job import run_audit

    journals = {n: tmp_path / f"journal-{n}" for n in "AB"}
    mesh = Routers(
        router, names=("A", "B"), extra_args=lambda name: ["--journal", str(journals[name])]
    )
    n = 100
    consumer = BlockingConnection(mesh.url("B"), timeout=10)
    receiver = consumer.create_receiver("queue", credit=200)
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            producer = BlockingConnection(mesh.url("A"), timeout=15)
            sender = producer.create_sender("queue")  # credit once A routes "queue" to B
            for i in range(n):
                sender.send(Message(body=f"q{i}"))
            producer.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    got = []
    for _ in range(n):
        got.append(receiver.receive(timeout=20).body)
        receiver.accept()
    deadline = time.monotonic() + 20
    while thread.is_alive() and time.monotonic() < deadline:
        try:  # receive() also does the consumer's I/O: the last accept must leave
            receiver.receive(timeout=0.2)
        except Timeout:
            pass
    assert not errors and not thread.is_alive(), errors
    assert got == [f"q{i}" for i in range(n)]
    consumer.close()
    for r in mesh.r.values():
        r.stop()  # SIGTERM: each writer publishes its last segment
    summary = run_audit(
        [str(d) for d in journals.values()],
        str(tmp_path / "out"),
        spark=spark,
        progress=lambda *a: None,
    )
    (a,) = [x for x in summary["by_address"] if x["address"] == "queue"]
    assert (a["published"], a["delivered"]) == (n, n)
    assert a["in_router_latency"]["count"] == n, "every delivery on B joins its publish on A"
    assert summary["unsettled"]["count"] == 0
