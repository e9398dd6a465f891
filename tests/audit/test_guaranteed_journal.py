"""A journalled mesh carrying a guaranteed topic is audited as one (issues 5 and 7): three
routers in a triangle, each with --journal; one publisher, a subscriber on every router; the
audit joins the rows of the three journals by origin and gives the exactly-once verdict."""

from __future__ import annotations

import json
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
