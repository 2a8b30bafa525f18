"""The statistics every benchmark figure is made of (benchmarks/stats.py, benchmarks/common.py):
medians, and nearest-rank percentiles on the small samples the benchmarks take (10 rounds)."""

from __future__ import annotations

from benchmarks.common import rate_summary
from benchmarks.stats import summary_ms

# 1 .. 10 ms, shuffled: the summary sorts.
TEN = [x / 1e3 for x in (7, 3, 10, 1, 9, 2, 8, 5, 4, 6)]


def test_the_median_of_an_even_count_is_the_mean_of_the_two_middle_samples() -> None:
    assert summary_ms(TEN)["median_ms"] == 5.5
    assert summary_ms(TEN[:9])["median_ms"] == 5.0  # 7 3 10 1 9 2 8 5 4: odd, the middle one


def test_p90_and_p99_are_nearest_ranks() -> None:
    # Nearest rank: the smallest sample with at least q of them at or below it.
    ten = summary_ms(TEN)
    assert (ten["p90_ms"], ten["p99_ms"], ten["min_ms"], ten["n"]) == (9.0, 10.0, 1.0, 10)
    hundred = summary_ms([x / 1e3 for x in range(100, 0, -1)])
    assert (hundred["p90_ms"], hundred["p99_ms"]) == (90.0, 99.0)
    eleven = summary_ms([x / 1e3 for x in range(1, 12)])
    assert eleven["p90_ms"] == 10.0  # ceil(9.9) = 10th of 11
    assert summary_ms([0.004])["p90_ms"] == 4.0


def test_a_rate_summary_has_the_true_median_and_the_slow_tenth() -> None:
    rates = [float(x) for x in (70, 30, 100, 10, 90, 20, 80, 50, 40, 60)]
    summary = rate_summary(rates)
    assert summary["median"] == 55.0  # not 60, the upper of the two middle samples
    assert summary["p10"] == 10.0  # 1 of 10 at or below it
    assert summary["n"] == 10
    assert rate_summary(rates[:9])["median"] == 50.0
    twenty = rate_summary([float(x) for x in range(1, 21)])
    assert (twenty["median"], twenty["p10"]) == (10.5, 2.0)  # 2 of 20 at or below: a tenth
    assert rate_summary([float(x) for x in range(1, 12)])["p10"] == 2.0  # ceil(1.1): 2nd of 11
