"""The latency bench's wake-up measurement (tools/bench/wakeup.c, latency.py, issue 18): the
tool builds with the system C compiler, reports one-way figures in order, pinned and not,
refuses a bad round count and a CPU it cannot have; the latency scenario's row beside direct
carries the median measurement and the p50 target's budget for a hop. The figures themselves
are the machine's, read by the bench, not asserted here."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from qrouter_tools.bench import latency
from qrouter_tools.bench import run as m

WAIT_S = 60.0


@pytest.fixture(scope="module")
def wakeup_bin() -> Path:
    if not shutil.which(os.environ.get("CC", "cc")):
        pytest.skip("no C compiler: the bench's wake-up tool is built with the system cc")
    return m.find_wakeup()


def report(binary: Path, *args: str) -> dict[str, float]:
    done = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=WAIT_S)
    assert done.returncode == 0, done.stderr
    fields = m._report("WAKEUP", done.stdout)
    return {k: float(v) for k, v in fields.items()}


def test_the_tool_reports_ordered_one_way_figures(wakeup_bin: Path) -> None:
    cpu = sorted(os.sched_getaffinity(0))[0]
    for args in (("2000",), ("2000", str(cpu), str(cpu))):
        r = report(wakeup_bin, *args)
        assert r["rounds"] == 2000
        assert 0 < r["p50_us"] <= r["p90_us"] <= r["p99_us"], r


def test_the_tool_refuses_a_bad_round_count_and_a_cpu_it_cannot_have(wakeup_bin: Path) -> None:
    for args in ([], ["0"], ["-5"], ["lots"]):
        done = subprocess.run([str(wakeup_bin), *args], capture_output=True, text=True, timeout=5)
        assert done.returncode == 2 and "usage" in done.stderr, args
    if (os.cpu_count() or 1) > 1000:
        pytest.skip("a machine of over 1,000 CPUs may have CPU 1023: no CPU index is refused")
    bad = "1023"  # the last CPU a cpu_set_t holds; sched_setaffinity refuses one not online
    done = subprocess.run(
        [str(wakeup_bin), "100", bad, bad], capture_output=True, text=True, timeout=WAIT_S
    )
    assert done.returncode == 2 and "sched_setaffinity" in done.stderr


def test_measure_wake_pins_two_cpus_and_one(wakeup_bin: Path) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        with pytest.raises(m.BenchError, match="one CPU"):
            latency.measure_wake(m)
        return
    w = latency.measure_wake(m)
    assert w.cpus == (cpus[0], cpus[1])
    assert 0 < w.p50 <= w.p90 <= w.p99 and w.same_p50 > 0


def test_the_row_beside_direct_has_the_median_and_the_budget() -> None:
    wakes = [
        latency.Wake((0, 1), 40.0, 50.0, 70.0, 2.0),
        latency.Wake((0, 1), 30.0, 45.0, 90.0, 1.5),
        latency.Wake((0, 1), 45.0, 55.0, 60.0, 2.5),
    ]
    direct = m.Run(2000.0, 1000, 1000, 0, 40, 60, 100, p999=200)
    row = latency.wake_row(m, wakes, "", direct)
    assert row.scenario == "wake-up across CPUs 0 and 1 (one way)"
    assert (row.p50_us, row.p90_us, row.p99_us) == (40, 50, 70)  # the median by p50
    assert "on one CPU 2.0" in row.note and "p50s 40.0/30.0/45.0" in row.note
    assert "the p50 target leaves a hop 0.3 × direct p50 = 12 µs" in row.note
    failed = latency.wake_row(m, [], "one CPU: there is no wake-up across CPUs to measure", direct)
    assert failed.p50_us is None and failed.note.startswith("failed: one CPU")
