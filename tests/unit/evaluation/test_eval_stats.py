"""Known answers for the bootstrap intervals and the paired test."""

from __future__ import annotations

import pytest

from service.evaluation.metrics import Ratio
from service.evaluation.stats import Bootstrap


def test_pooled_value_is_sum_of_errors_over_sum_of_totals() -> None:
    # 1/10 and 3/10: pooled 4/20 = 0.2 (not the mean of 0.1 and 0.3 weighted otherwise); 1/2 and 3/18 pool to 0.2 too
    result = Bootstrap(samples=200).interval([Ratio(1, 2), Ratio(3, 18)])
    assert result["value"] == pytest.approx(0.2)
    assert result["n"] == 2


def test_identical_items_give_a_degenerate_interval() -> None:
    result = Bootstrap(samples=200).interval([Ratio(1, 10)] * 5)
    assert result["ci_low"] == pytest.approx(0.1) and result["ci_high"] == pytest.approx(0.1)


def test_interval_is_seeded_and_brackets_the_value() -> None:
    ratios = [Ratio(e, 10) for e in (0, 1, 2, 5, 9)]
    first, second = Bootstrap(seed=3).interval(ratios), Bootstrap(seed=3).interval(ratios)
    assert first == second
    assert first["ci_low"] < first["value"] < first["ci_high"]
    assert Bootstrap(seed=4).interval(ratios) != first


def test_paired_test_on_identical_systems_is_not_significant() -> None:
    ratios = [Ratio(e, 10) for e in (0, 1, 2, 5, 9)]
    result = Bootstrap().paired(ratios, ratios)
    assert result["difference"] == 0 and result["significant"] is False and result["p_value"] == 1.0


def test_paired_test_finds_a_consistent_difference() -> None:
    a = [Ratio(e + 2, 10) for e in (0, 1, 2, 5, 6, 3, 1, 0)]
    b = [Ratio(e, 10) for e in (0, 1, 2, 5, 6, 3, 1, 0)]
    # every item 2/10 worse: difference 0.2 in every replicate
    result = Bootstrap().paired(a, b)
    assert result["difference"] == pytest.approx(0.2)
    assert result["significant"] is True and result["p_value"] == 0.0
