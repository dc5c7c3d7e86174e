"""The capacity sweep's row: the cores a load asks for are the CPU a task times the rate,
and a rate counts as kept only when its p99 and its share run by the deadline both hold."""

from __future__ import annotations

from dataclasses import replace

from benchmarks.capacity import row
from benchmarks.cpu import CpuUse
from benchmarks.lateness import Outcome


def outcome(lateness_s: float, ran: int, expected: int, cpu_seconds: dict[str, float]) -> Outcome:
    return Outcome([lateness_s] * ran, expected, expected, 0, 0,
                   cpu=CpuUse(cpu_seconds, wall=10.0, busy=0.8))


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_demand_is_cpu_a_task_times_the_rate() -> None:
    # 1,000 tasks: 1.2 s of worker CPU and 0.3 s of dispatcher CPU is 1.5 ms a task
    line = cells(row("celery_scheduler", 800, outcome(0.005, 1000, 1000,
                                                      {"workers": 1.2, "dispatcher": 0.3})))
    assert line[0] == "celery_scheduler" and line[1] == "800"
    assert line[4] == ""  # no release times: not split
    assert line[6] == "yes" and line[7] == "80%"
    assert line[8] == "1.50" and line[9] == "1.20"  # 1.5 ms x 800/s = 1.2 cores
    assert line[10] == "workers 1.20, dispatcher 0.30"


def test_a_late_or_unfinished_rate_is_not_kept() -> None:
    late = cells(row("Celery eta=", 1000, outcome(0.250, 1000, 1000, {"workers": 2.0})))
    assert late[3] == "250.0" and late[6] == "no"
    unfinished = cells(row("Celery eta=", 1000, outcome(0.005, 900, 1000, {"workers": 2.0})))
    assert unfinished[5] == "90.0%" and unfinished[6] == "no"


def test_the_scheduler_s_lateness_is_split_at_its_publish() -> None:
    split = replace(outcome(0.030, 100, 100, {"dispatcher": 0.1}),
                    to_release=[0.020] * 100, after_release=[0.010] * 100)
    assert cells(row("celery_scheduler", 100, split))[4] == "20.0 / 10.0"
