"""The switch interval follows how late the engine's releases are (pace.Switching)."""

from __future__ import annotations

from celery_scheduler.dispatcher.pace import BEHIND_SWITCH_INTERVAL, ON_TIME_SWITCH_INTERVAL, Switching


def test_a_step_a_second_late_puts_the_process_behind_and_one_on_time_brings_it_back() -> None:
    intervals: list[float] = []
    switching = Switching(intervals.append)
    switching.released(999)
    assert not switching.behind and intervals == []
    switching.released(1000)
    assert switching.behind and intervals == [BEHIND_SWITCH_INTERVAL]
    switching.released(101)  # catching up: still behind
    switching.released(5000)
    assert switching.behind and intervals == [BEHIND_SWITCH_INTERVAL]
    switching.released(100)
    assert not switching.behind and intervals == [BEHIND_SWITCH_INTERVAL, ON_TIME_SWITCH_INTERVAL]
    switching.released(-300)  # marked ahead of its due time
    assert intervals == [BEHIND_SWITCH_INTERVAL, ON_TIME_SWITCH_INTERVAL]


def test_nothing_due_is_on_time() -> None:
    intervals: list[float] = []
    switching = Switching(intervals.append)
    switching.released(None)
    assert intervals == []  # on time from the start: nothing to set
    switching.released(60_000)
    switching.released(None)
    assert intervals == [BEHIND_SWITCH_INTERVAL, ON_TIME_SWITCH_INTERVAL]


def test_without_a_setter_it_only_keeps_the_state() -> None:
    switching = Switching()
    switching.released(2000)
    assert switching.behind
    switching.released(None)
    assert not switching.behind
