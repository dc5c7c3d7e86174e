"""Scenario 12's growth figure: run by run, the worst later point against the first, so one
point that costs more fails the bound even if the last one does not."""

from __future__ import annotations

import math

import pytest

from benchmarks.scale import CPU_GROWTH_TARGET, growth_by_run


def test_growth_is_taken_run_by_run_against_the_worst_later_point() -> None:
    costs = [[0.50, 0.40], [0.55, 0.42], [0.52, 0.48]]  # 10k, 100k, 1M pending; two runs
    assert growth_by_run(costs) == pytest.approx([0.10, 0.20])
    assert max(growth_by_run(costs)) <= CPU_GROWTH_TARGET


def test_a_point_that_costs_more_in_the_middle_fails_the_bound() -> None:
    assert growth_by_run([[0.5], [0.7], [0.5]]) == pytest.approx([0.4])
    assert growth_by_run([[0.5], [0.7], [0.5]])[0] > CPU_GROWTH_TARGET


def test_a_missing_cost_is_not_a_number() -> None:
    assert math.isnan(growth_by_run([[math.nan], [0.5]])[0])
