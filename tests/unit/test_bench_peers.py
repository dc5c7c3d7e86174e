"""The benchmark's pure parts around the peers: counting runs, filling a backlog, empty rows."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks.backlog import SPACING, _backlog, fill
from benchmarks.context import Context
from benchmarks.cpu import CpuUse
from benchmarks.duplicates import RUNS, Twice, _rounds, count_runs
from benchmarks.execlog import Start
from benchmarks.failover import crash_outcome
from benchmarks.stats import Figure


def test_a_task_run_twice_counts_one_extra_run() -> None:
    # given tasks 10..13, of which 11 ran twice and 13 never; 9 and 14 belong to others
    outcome = count_runs([9, 10, 11, 11, 12, 14], first=10, tasks=4)
    assert (outcome.ran, outcome.extra, outcome.missing) == (3, 1, 1)


def test_tasks_run_once_each_count_no_extra_run() -> None:
    outcome = count_runs([2, 0, 1], first=0, tasks=3)
    assert (outcome.ran, outcome.extra, outcome.missing) == (3, 0, 0)


def test_the_systems_run_in_turn_and_one_that_failed_is_not_tried_again(tmp_path: Path) -> None:
    calls: list[str] = []

    def trial(system: str) -> Twice:
        calls.append(system)
        if system == "b" and calls.count("b") == 2:
            raise RuntimeError("its broker went away")
        return Twice(10, 10, 0)

    errors: list[str] = []
    outcomes = _rounds(Context(quick=False, tmp=tmp_path, runs=5), ("a", "b", "c"), trial, errors)
    assert calls == ["a", "b", "c", "a", "b", "c"] + ["a", "c"] * (RUNS - 2)
    assert {system: len(runs) for system, runs in outcomes.items()} == {"a": RUNS, "b": 1, "c": RUNS}
    assert errors == ["b: RuntimeError: its broker went away"]


def test_fill_hands_over_every_task_in_batches() -> None:
    batches: list[int] = []
    stored, rate = fill(_backlog(2_500, 10, 100.0), lambda chunk: batches.append(len(chunk)), 60)
    assert stored == 2_500
    assert batches == [1000, 1000, 500]
    assert rate > 0


def test_fill_stops_when_its_time_is_up() -> None:
    stored, _ = fill(_backlog(10, 2, 0.0), lambda chunk: None, 0)
    assert stored == 0


def test_backlog_keeps_schedule_order_within_each_ordering_id() -> None:
    tasks = list(_backlog(6, 2, 100.0))
    assert [t[0] for t in tasks] == ["o0", "o1", "o0", "o1", "o0", "o1"]
    assert [t[2] for t in tasks] == sorted(t[2] for t in tasks)
    assert tasks[1][2] - tasks[0][2] == pytest.approx(SPACING)


def test_a_row_a_peer_cannot_fill_reads_not_applicable() -> None:
    assert str(Figure.of([])) == "n/a"


def test_cpu_per_task_of_a_system_that_ran_nothing_is_not_a_number() -> None:
    # a peer that missed every deadline still gets its CPU rows, as n/a
    use = CpuUse({"workers": 2.0}, wall=1.0, busy=0.5)
    assert use.ms_per_task(4) == {"workers": 500.0}
    assert math.isnan(use.ms_per_task(0)["workers"])


def _start(seq: int, started: float) -> Start:
    return Start(f"crash{seq}", seq, 0.0, started, 1)


def test_a_crash_reports_when_the_cut_short_task_ran_again() -> None:
    # given a kill at t=10 while task 1 ran (started 0.05 s before), and task 1 again at t=12
    starts = [_start(0, 9.8), _start(1, 9.95), _start(2, 10.5), _start(1, 12.0)]
    outcome = crash_outcome(starts, count=3, killed=10.0, body=0.1)
    assert outcome.recovered == pytest.approx(0.5)  # every task had started once by t=10.5
    assert outcome.rerun == pytest.approx(2.0)
    assert (outcome.missing, outcome.duplicates) == (0, 1)


def test_a_task_cut_short_and_never_run_again_shows_no_rerun() -> None:
    outcome = crash_outcome([_start(0, 9.95), _start(1, 10.5)], count=3, killed=10.0, body=0.1)
    assert math.isnan(outcome.rerun)
    assert math.isnan(outcome.recovered)  # task 2 never started
    assert outcome.missing == 1


def test_a_kill_between_two_tasks_cut_nothing_short() -> None:
    # the last start before the kill had finished its 0.1 s body: nothing to run again
    outcome = crash_outcome([_start(0, 9.5), _start(1, 10.2)], count=2, killed=10.0, body=0.1)
    assert math.isnan(outcome.rerun)
    assert outcome.recovered == pytest.approx(0.2)


def test_order_and_overlaps_of_failover_runs() -> None:
    from benchmarks.execlog import Start
    from benchmarks.failover import order_and_overlaps

    def start(ordering_id: str, seq: int, at: float) -> Start:
        return Start(ordering_id, seq, 0.0, at, 1)

    clean = [start("a", 0, 1.0), start("a", 1, 2.0), start("b", 0, 1.001)]
    assert order_and_overlaps(clean, 0.005) == (0, 0)
    assert order_and_overlaps([start("a", 1, 1.0), start("a", 0, 2.0)], 0.005) == (1, 0)
    assert order_and_overlaps([start("a", 0, 1.0), start("a", 1, 1.002)], 0.005) == (0, 1)
