"""The latency sweep's rate ladder and table (tools/bench/sweep.py): the parts that need no
router (the sweep itself is a benchmark, run by hand)."""

from __future__ import annotations

import pytest
from qrouter_tools.bench.sweep import Point, print_sweep, rates


def test_ladder_stops_at_80_percent_of_the_maximum() -> None:
    assert rates(200_000) == [1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 160_000]
    assert rates(60_000) == [1_000, 2_000, 5_000, 10_000, 20_000, 48_000]
    # the cap (104k) is within 20% of the last step: not run twice
    assert rates(130_000) == [1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000]
    assert rates(30_000) == [1_000, 2_000, 5_000, 10_000, 20_000]  # 24k: within 20%


def test_ladder_of_a_router_slower_than_the_first_rate_is_empty() -> None:
    assert rates(1_000) == []


def test_table_has_ratios_to_direct_and_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    points = [
        Point("direct", 2_000, 40, 60, 100, 200, None),
        Point("one hop", 2_000, 60, 90, 150, 300, 20.0),
        Point("two hops", 2_000, 80, 120, 300, 600, 41.5),
    ]
    print_sweep(points, {"direct": 900_000.0})
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 2,000")]
    assert row == [
        "| 2,000 | 40 / 60 / 100 / 200 | 60 / 90 / 150 / 300 | 1.50 / 1.50 | 20.0 "
        "| 80 / 120 / 300 / 600 | 2.00 / 3.00 | 41.5 |"
    ]


def test_table_has_the_relay_columns_when_relays_ran(capsys: pytest.CaptureFixture[str]) -> None:
    points = [
        Point("direct", 1_000, 40, 60, 100, 200, None),
        Point("relay 1 hop", 1_000, 50, 70, 110, 220, 11.0),
        Point("one hop", 1_000, 60, 90, 150, 300, 20.0),
    ]
    print_sweep(points, {})
    out = capsys.readouterr().out.splitlines()
    head = next(line for line in out if line.startswith("| rate"))
    assert "relay 1 hop × direct p50/p99" in head and "two hops" not in head
    row = next(line for line in out if line.startswith("| 1,000"))
    assert row == (
        "| 1,000 | 40 / 60 / 100 / 200 | 50 / 70 / 110 / 220 | 1.25 / 1.10 | 11.0 "
        "| 60 / 90 / 150 / 300 | 1.50 / 1.50 | 20.0 |"
    )


def test_the_wake_up_line_is_printed_over_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    from qrouter_tools.bench import latency
    from qrouter_tools.bench import run as m
    from qrouter_tools.bench.sweep import wake_line

    def refuse(_m: object) -> None:
        raise m.BenchError("one CPU: there is no wake-up across CPUs to measure")

    class Fake:
        measure_wake = staticmethod(refuse)

    assert wake_line(m, Fake) == (  # type: ignore[arg-type]
        "wake-up across CPUs: not measured (one CPU: there is no wake-up across CPUs to measure)"
    )
    Fake.measure_wake = staticmethod(lambda _m: latency.Wake((0, 1), 38.04, 45.0, 70.26, 1.31))
    line = wake_line(m, Fake)  # type: ignore[arg-type]
    assert line.startswith("wake-up across CPUs 0 and 1 (one way, wakeup.c): p50 38.0 / p99 70.3")
    assert "on one CPU 1.3" in line
    print_sweep([Point("direct", 1_000, 40, 60, 100, 200, None)], {}, line)
    out = capsys.readouterr().out.splitlines()
    assert out.index(line) == out.index(next(x for x in out if x.startswith("| rate"))) - 1
