"""How the exactly-once RSS rows (tools/bench/run.py, `mesh-exactly-once*-rss`) compute the
routers' growth over the rounds. The scenarios themselves are benchmarks, run by hand."""

from __future__ import annotations

import pytest
from qrouter_tools.bench.run import rss_drift_from_first, rss_growth, rss_spread


def test_a_steady_rise_counts_over_the_whole_span() -> None:
    # 2 MiB a round on 100 MiB: rounds 2..10 (after the warm-up) read 102..118. The medians
    # of the two halves (rounds 2-5 against 7-10) read +9.5% and passed the target.
    readings = [[100.0 + 2 * i, 40.0] for i in range(10)]
    (grows, flat) = rss_growth(readings)
    assert grows == pytest.approx(16 / 102) and grows > 0.10
    assert flat == 0


def test_one_wild_reading_does_not_set_the_line() -> None:
    # rounds 2..10 rise 0.5 MiB a round around 40 MiB but for one reading of 99
    readings = [[r] for r in (30, 40, 40, 41, 40, 99, 44, 44, 43, 44)]
    assert rss_growth(readings) == pytest.approx([0.5 * 8 / 40])


def test_one_reading_off_moves_growth_less_than_the_drift_from_round_1() -> None:
    # a low first round and one high reading: the older figure takes either whole
    readings = [[36.0]] + [[40.0]] * 4 + [[46.0]] + [[40.0]] * 4
    assert rss_growth(readings) == [0]
    assert rss_spread(readings) == pytest.approx([0.15])
    assert rss_drift_from_first(readings) == pytest.approx([10 / 36])


def test_too_few_rounds_is_an_error_and_three_rounds_compare_two() -> None:
    with pytest.raises(ValueError):
        rss_growth([[40.0], [41.0]])
    assert rss_growth([[30.0], [40.0], [42.0]]) == pytest.approx([0.05])
