"""Scenario 10's count: each occurrence (entry, minute) of the window run once, missed or
run twice, and how late it was sent and started."""

from __future__ import annotations

import math

from benchmarks.execlog import occurrence_of
from benchmarks.periodic import count_firings


def test_each_occurrence_of_the_window_is_counted_once_missed_or_twice() -> None:
    minute = 29_000_000
    at = minute * 60.0
    starts = [
        ("p0", minute, at, at + 0.5, at + 0.1),
        ("p1", minute, at, at + 2.0, at + 1.5),
        ("p1", minute, at, at + 0.9, at + 0.2),  # a second run, which started first
        ("p0", minute + 1, at + 60, at + 61, None),  # sent unknown: counted as at the start
        ("p0", minute + 2, at + 120, at + 120.1, at + 120),  # outside the window
        ("p9", minute, at, at + 0.1, at),  # no entry of the run's
    ]
    firing = count_firings(starts, entries=2, first_minute=minute, last_minute=minute + 1)
    assert (firing.expected, firing.once, firing.missed, firing.twice) == (4, 2, 1, 1)
    assert [round(late, 3) for late in sorted(firing.started_late)] == [0.5, 0.9, 1.0]
    assert [round(late, 3) for late in sorted(firing.sent_late)] == [0.1, 0.2, 1.0]


def test_a_run_is_put_at_the_minute_it_was_sent_for_a_second_early_or_a_minute_late() -> None:
    minute = 29_000_000 * 60.0
    assert occurrence_of(minute - 0.5) == minute  # a dispatcher's release ahead of its time
    assert occurrence_of(minute) == minute
    assert occurrence_of(minute + 58.9) == minute  # celery beat, late
    assert occurrence_of(minute + 59.5) == minute + 60
    assert math.isclose(occurrence_of(minute - 1.5), minute - 60)
