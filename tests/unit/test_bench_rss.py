"""How the exactly-once RSS rows (tools/bench/run.py, `mesh-exactly-once*-rss`) compute the
routers' growth over the rounds. The scenarios themselves are benchmarks, run by hand."""

from __future__ import annotations

import pytest
from qrouter_tools.bench.run import rss_drift_from_first, rss_growth, rss_spread


def test_growth_compares_the_halves_after_the_warm_up() -> None:
    # one router; round 1 is the warm-up; rounds 2-5 then 7-10 (round 6, the middle, in neither)
    readings = [[r] for r in (30, 40, 40, 41, 40, 99, 44, 44, 43, 44)]
    assert rss_growth(readings) == pytest.approx([44 / 40 - 1])


def test_a_trend_shows_and_a_flat_run_does_not() -> None:
    rising = [[40 + 2 * i, 40.0] for i in range(10)]  # router 1 grows 2 MiB a round: 42..58
    (grows, flat) = rss_growth(rising)
    assert grows == pytest.approx(55 / 45 - 1) and grows > 0.10  # 52..58 over 42..48
    assert flat == 0


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
