"""The PySpark audit in local mode over generated journals with known numbers and faults.

One SparkSession serves the module (tests/audit/conftest.py); each audit takes a few
seconds on it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from click.testing import CliRunner  # noqa: E402
from qrouter_tools.audit.cli import audit_command  # noqa: E402
from qrouter_tools.audit.generate import GenConfig, GenResult, generate  # noqa: E402
from qrouter_tools.audit.job import run_audit  # noqa: E402

TRANSIT, WIRE, JITTER = 200_000, 100_000, 20_000


def quiet(_step: int, _total: int, _what: str) -> None:
    pass


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> GenResult:
    """3 routers in a line, 2 topics x 2 publishers x 2 subscribers, 1000 messages each."""
    cfg = GenConfig(
        routers=3,
        addresses=2,
        publishers_per_address=2,
        subscribers_per_address=2,
        messages_per_publisher=1000,
        rate_per_publisher=500,
        transit_ns=TRANSIT,
        wire_ns=WIRE,
        jitter_ns=JITTER,
        reject_every=10,
        release=2,
        unsettled=3,
        credit_stalls=2,
        credit_stall_ns=4_000_000,
        seed=7,
    )
    return generate(tmp_path_factory.mktemp("mesh"), cfg)


def by(rows: list[dict[str, Any]], key: str) -> dict[str, dict[str, Any]]:
    return {r[key]: r for r in rows}


def test_cli_audit_of_a_mesh_reports_the_known_numbers(
    spark: Any, mesh: GenResult, tmp_path: Path
) -> None:
    out = tmp_path / "report"
    result = CliRunner().invoke(audit_command, [*mesh.dirs, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "Guarantees" in result.output and "PASS" in result.output
    assert "audit [1/" in result.output  # progress lines
    summary = json.loads((out / "summary.json").read_text())

    assert summary["rows"] == mesh.rows
    assert summary["routers"] == ["r0", "r1", "r2"]
    assert summary["segments"] == 3
    addresses = by(summary["by_address"], "address")
    assert sorted(addresses) == ["topic-0", "topic-1"]
    for name, a in addresses.items():
        assert a["published"] == mesh.published[name] == 2000
        assert a["publishes"] == 2000
        assert a["subscribers"] == 2
        assert a["delivered"] == mesh.delivered[name] == 4000
        assert a["outcomes"] == mesh.consumer_outcomes[name]
        assert a["publisher_outcomes"]["accepted"] + a["publisher_outcomes"]["rejected"] == (
            2000 - sum(1 for o in mesh.unsettled if o.startswith(f"pubc-{name[-1]}-"))
        )
        assert a["credit_stalls"] == {"count": 4, "total_ns": 16_000_000, "max_ns": 4_000_000}
        lo, hi = mesh.latency_bounds[name]
        lat = a["in_router_latency"]
        assert lat["count"] == 4000  # one per (delivery, subscriber)
        assert lo <= lat["min_ns"] <= lat["p50_ns"] <= lat["p90_ns"] <= lat["p99_ns"]
        assert lat["p99_ns"] <= lat["max_ns"] <= hi
        # Subscribers 0, 1 or 2 hops away: 200, 500 or 800 us (+- jitter).
        assert abs(lat["max_ns"] - (3 * TRANSIT + 2 * WIRE)) <= JITTER
        # The round trip at the publisher's router: every publish with its outcome back (the
        # unsettled ones have none), as long as its farthest subscriber's answer takes.
        lo, hi = mesh.round_trip_bounds[name]
        rtt = a["edge_round_trip"]
        assert rtt["count"] == 2000 - sum(
            1 for o in mesh.unsettled if o.startswith(f"pubc-{name[-1]}-")
        )
        assert lo <= rtt["min_ns"] <= rtt["p50_ns"] <= rtt["p99_ns"] <= rtt["max_ns"] <= hi
        assert rtt["min_ns"] > lat["min_ns"]  # the outcome comes after the delivery went out
        # Two publishers at 500/s for 2 s: 1000 published in each 1 s bucket.
        thr = [r for r in summary["throughput"]["by_address"] if r["address"] == name]
        assert [(r["second"], r["published"]) for r in thr] == [(0, 1000), (1, 1000)]
        assert sum(r["bytes"] for r in thr) == 2000 * 256
        assert summary["verdicts"][name]["verdict"] == "pass"
        assert summary["verdicts"][name]["lost_count"] == 0
        assert summary["verdicts"][name]["duplicated_count"] == 0
        assert summary["verdicts"][name]["expected"] == 4000

    hops = {(h["from_router"], h["to_router"]): h for h in summary["latency"]["hops"]}
    assert {f"{a}>{b}": h["count"] for (a, b), h in hops.items()} == mesh.hops
    for h in hops.values():
        assert TRANSIT + WIRE - JITTER <= h["min_ns"] <= h["max_ns"] <= TRANSIT + WIRE + JITTER
    for r in summary["by_router"]:
        t = r["transit_latency"]
        assert TRANSIT - JITTER <= t["min_ns"] <= t["max_ns"] <= TRANSIT + JITTER
    # each publish's round trip is counted at its publisher's router (all three have some)
    rtts = [r["edge_round_trip"]["count"] for r in summary["by_router"]]
    assert all(rtts) and sum(rtts) == 4000 - len(mesh.unsettled)
    assert sum(r["events"].get("released-back", 0) for r in summary["by_router"]) == 2

    assert summary["unsettled"]["count"] == 3
    assert {u["origin"] for u in summary["unsettled"]["listed"]} == set(mesh.unsettled)

    for name in ("summary.json", "report.html", "throughput.png", "latency.png"):
        assert (out / name).stat().st_size > 0, name
    for name in ("throughput.png", "latency.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 2
    assert "topic-0" in page and "PASS" in page


def test_a_lost_delivery_fails_the_verdict_and_is_named(spark: Any, tmp_path: Path) -> None:
    cfg = GenConfig(
        routers=2,
        messages_per_publisher=300,
        lose_at=[(0, 1, 123, 1), (1, 0, 5, 0)],
        seed=3,
    )
    res = generate(tmp_path / "journal", cfg)
    summary = run_audit(
        res.dirs,
        str(tmp_path / "out"),
        spark=spark,
        progress=quiet,
        guarantees={"topic-1": "at-least-once"},
        plots=False,
    )
    v0, v1 = summary["verdicts"]["topic-0"], summary["verdicts"]["topic-1"]
    assert (v0["guarantee"], v0["verdict"], v0["lost_count"]) == ("exactly-once", "fail", 1)
    assert (v1["guarantee"], v1["verdict"], v1["lost_count"]) == ("at-least-once", "fail", 1)
    assert v0["duplicated_count"] == v1["duplicated_count"] == 0
    lost = {f.address: f for f in res.lost}
    for v, name in ((v0, "topic-0"), (v1, "topic-1")):
        (item,) = v["lost"]
        fault = lost[name]
        assert (item["tag"], item["origin"], item["router"], item["link"]) == (
            fault.tag,
            fault.origin,
            fault.router,
            fault.link,
        )
    assert lost["topic-0"].tag == (123).to_bytes(8, "big").hex()
    assert summary["by_address"][0]["delivered"] == 2 * 300 * 2 - 1


def test_a_duplicate_fails_exactly_once_but_not_at_least_once(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = GenConfig(
        routers=3,
        messages_per_publisher=300,
        duplicate_at=[(0, 0, 7, 0), (1, 1, 9, 1)],
        seed=4,
    )
    res = generate(tmp_path / "journal", cfg)
    summary = run_audit(
        res.dirs,
        str(tmp_path / "out"),
        spark=spark,
        progress=quiet,
        guarantees={"topic-1": "at-least-once"},
        plots=False,
    )
    v0, v1 = summary["verdicts"]["topic-0"], summary["verdicts"]["topic-1"]
    assert (v0["verdict"], v0["lost_count"], v0["duplicated_count"]) == ("fail", 0, 1)
    (item,) = v0["duplicated"]
    fault = next(f for f in res.duplicated if f.address == "topic-0")
    assert item["tag"] == fault.tag == (7).to_bytes(8, "big").hex()
    assert (item["router"], item["link"], item["times"]) == (fault.router, fault.link, 2)
    assert (v1["verdict"], v1["lost_count"], v1["duplicated_count"]) == ("pass", 0, 1)

    from qrouter_tools.audit.report import render_terminal

    render_terminal(summary)
    printed = capsys.readouterr().out
    assert f"duplicated x2: topic-0 tag {fault.tag}" in printed
    assert "FAIL" in printed


def test_journals_with_the_origin_in_one_column_audit_the_same(spark: Any, tmp_path: Path) -> None:
    """Journals written before origin_prefix / origin_tag hold the origin whole in `origin`;
    the audit reads both kinds, also mixed in one run."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cfg = GenConfig(routers=2, messages_per_publisher=200, lose_at=[(0, 1, 17, 0)], seed=5)
    res = generate(tmp_path / "journal", cfg)
    new = run_audit(res.dirs, str(tmp_path / "new"), spark=spark, progress=quiet, plots=False)
    (old_dir,) = [d for d in res.dirs if d.endswith("r0")]
    for path in Path(old_dir).glob("*.parquet"):
        t = pq.read_table(path)
        origins = [
            None if p is None else p + tag.hex()
            for p, tag in zip(
                t["origin_prefix"].to_pylist(), t["origin_tag"].to_pylist(), strict=True
            )
        ]
        t = t.drop_columns(["origin_prefix", "origin_tag"]).append_column(
            "origin", pa.array(origins, pa.string())
        )
        pq.write_table(t, path)
    old = run_audit(res.dirs, str(tmp_path / "old"), spark=spark, progress=quiet, plots=False)
    for key in ("rows", "verdicts", "unsettled"):
        assert old[key] == new[key]
    counts = ("address", "published", "delivered", "outcomes", "publisher_outcomes")
    assert [{k: a[k] for k in counts} for a in old["by_address"]] == [
        {k: a[k] for k in counts} for a in new["by_address"]
    ]
    assert new["verdicts"]["topic-0"]["lost"][0]["origin"] == res.lost[0].origin
