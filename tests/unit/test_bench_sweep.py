"""Scenario 3c's bisection finds the highest punctual rate of its grid in few runs, says when
none was punctual, and refuses results that break its assumption."""

from __future__ import annotations

import pytest

from benchmarks.sweep import Sweep

GRID = list(range(100, 1001, 50))


def found(limit: int) -> Sweep:
    sweep = Sweep(GRID)
    while (rate := sweep.next()) is not None:
        sweep.record(rate, rate <= limit)
    return sweep


@pytest.mark.parametrize("limit", [100, 150, 350, 400, 950, 1000])
def test_the_highest_punctual_rate_is_found_in_a_handful_of_runs(limit: int) -> None:
    sweep = found(limit)
    assert sweep.highest == limit
    assert len(sweep.tried) <= 5  # 19 rates: at most five runs
    assert (limit, True) in sweep.tried and (limit + 50 <= 1000) == ((limit + 50, False) in sweep.tried)


def test_a_system_punctual_at_no_rate_has_zero() -> None:
    sweep = found(50)
    assert sweep.highest == 0 and sweep.tried[-1] == (100, False)


def test_a_lower_rate_late_after_a_higher_one_punctual_is_refused() -> None:
    sweep = Sweep(GRID)
    sweep.record(500, True)
    with pytest.raises(ValueError, match="assumes"):
        sweep.record(300, False)


def test_punctual_needs_the_load_on_time_the_tasks_run_and_a_low_p99() -> None:
    from benchmarks.lateness import Outcome
    from benchmarks.sweep import punctual

    assert punctual(Outcome([0.05] * 100, 100, 100, 0, 0))
    assert not punctual(Outcome([0.05] * 98 + [0.5] * 2, 100, 100, 0, 0))  # p99 500 ms
    assert not punctual(Outcome([0.05] * 98, 100, 100, 0, 0))  # 98% ran
    assert not punctual(Outcome([0.05] * 100, 100, 100, 2, 0))  # 2% published late


def test_a_capacity_row_calls_a_run_whose_load_was_published_late_not_punctual() -> None:
    from benchmarks.capacity import row
    from benchmarks.lateness import Outcome

    assert "| yes |" in row("s", 100, Outcome([0.05] * 100, 100, 100, 0, 0))
    assert "| no |" in row("s", 100, Outcome([0.05] * 100, 100, 100, 2, 0))  # 2% published late
