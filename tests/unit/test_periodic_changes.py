"""Run-time changes over beat_schedule: kept as JSON without loss, and the entries in force."""

from __future__ import annotations

import datetime as dt
import logging

import pytest
from celery.schedules import crontab, solar

from celery_scheduler.periodic_changes import definition_of, entry_of_definition, in_force
from celery_scheduler.periodic_entries import entry_of
from celery_scheduler.store.records import EntryChange

UTC = dt.timezone.utc


@pytest.mark.parametrize("spec", [
    {"task": "t", "schedule": 90, "args": [1, "a"], "kwargs": {"k": None}, "options": {"queue": "q"},
     "catch_up": "all", "jitter": 2.5, "overlap": "skip"},
    {"task": "t", "schedule": crontab(minute="*/5", hour="9-17", day_of_week="mon-fri"),
     "start": "2030-01-01T00:00:00Z", "count": 4},
    {"task": "t", "schedule": dt.timedelta(hours=1), "until": dt.datetime(2031, 1, 1, tzinfo=UTC)},
    {"task": "t", "schedule": solar("sunset", 52.52, 13.4), "catch_up": "none"},
])
def test_a_definition_kept_as_json_reads_back_as_the_same_entry(spec: dict[str, object]) -> None:
    entry = entry_of("e", spec)
    assert entry_of_definition("e", definition_of("e", spec)) == entry


def test_run_time_changes_win_over_beat_schedule(caplog: pytest.LogCaptureFixture) -> None:
    code = [entry_of(name, {"task": "t", "schedule": 60}) for name in ("a", "b", "c", "d")]
    replaced = definition_of("b", {"task": "t", "schedule": 30})
    changes = {
        "a": EntryChange("a", paused=True),
        "b": EntryChange("b", definition=replaced),
        "c": EntryChange("c", deleted=True),
        "d": EntryChange("d", resumed_ms=1_000),
        "new": EntryChange("new", definition=definition_of("new", {"task": "t", "schedule": 5})),
        "broken": EntryChange("broken", definition=definition_of("broken", {"task": "gone", "schedule": 5})),
    }
    with caplog.at_level(logging.WARNING):
        entries, floors = in_force(code, changes, known_tasks={"t"})
    assert [(e.name, e.schedule.run_every.total_seconds()) for e in entries] == [  # type: ignore[union-attr]
        ("b", 30.0), ("d", 60.0), ("new", 5.0)]
    assert floors == {"d": 1_000}
    assert "'broken'" in caplog.text and "left out" in caplog.text
