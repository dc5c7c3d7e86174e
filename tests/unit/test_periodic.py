"""Periodic entries (celery_scheduler.periodic): beat_schedule read and checked, occurrences
computed by Celery's own schedule classes, keys that every process computes alike, and what
runs after downtime."""

from __future__ import annotations

import datetime as dt
import functools
import itertools
import zoneinfo
from typing import Any

import pytest
from celery.schedules import crontab, schedule, solar

from celery_scheduler import periodic
from celery_scheduler.errors import ConfigurationError, PeriodicEntryError
from celery_scheduler.partitioner import partition_for
from celery_scheduler.periodic import CatchUp, entry_name_of, key, next_occurrence, occurrences, to_fire
from celery_scheduler.periodic_entries import entries, entry_of

BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")
UTC = dt.timezone.utc


def ms(*parts: int, tz: dt.tzinfo = UTC) -> int:
    return int(dt.datetime(*parts, tzinfo=tz).timestamp() * 1000)  # type: ignore[misc]


def local(at_ms: int, tz: dt.tzinfo = BERLIN) -> str:
    return dt.datetime.fromtimestamp(at_ms / 1000, tz).isoformat()


def test_an_interval_fires_at_its_multiples_since_the_epoch_whatever_relative_says() -> None:
    every_five = [entry_of("a", {"task": "t", "schedule": 300}),
                  entry_of("b", {"task": "t", "schedule": dt.timedelta(minutes=5)}),
                  entry_of("c", {"task": "t", "schedule": schedule(dt.timedelta(minutes=5)),
                                 "relative": True})]
    after = ms(2030, 1, 1, 9, 2, 10)
    for entry in every_five:
        assert occurrences(entry, after, after + 15 * 60_000, UTC) == [
            ms(2030, 1, 1, 9, 5), ms(2030, 1, 1, 9, 10), ms(2030, 1, 1, 9, 15)]
    # an occurrence exactly at the start is not "after" it
    assert occurrences(every_five[0], ms(2030, 1, 1, 9, 5), ms(2030, 1, 1, 9, 10), UTC) == [
        ms(2030, 1, 1, 9, 10)]


def test_a_crontab_fires_at_wall_times_of_the_apps_timezone() -> None:
    weekdays = entry_of("report", {"task": "t", "schedule": crontab(minute=0, hour=7,
                                                                    day_of_week="mon-fri")})
    # Friday 2030-01-04 12:00 Berlin to the next Tuesday: Monday and Tuesday 07:00
    found = occurrences(weekdays, ms(2030, 1, 4, 12, tz=BERLIN), ms(2030, 1, 8, 12, tz=BERLIN),
                        BERLIN)
    assert [local(at) for at in found] == ["2030-01-07T07:00:00+01:00", "2030-01-08T07:00:00+01:00"]


def test_a_wall_time_a_clock_change_skips_runs_once_and_one_it_repeats_runs_once() -> None:
    nightly = entry_of("nightly", {"task": "t", "schedule": crontab(minute=30, hour="1-3")})
    spring = occurrences(nightly, ms(2026, 3, 28, 22), ms(2026, 3, 29, 12), BERLIN)
    # 02:30 does not exist that night: it is the instant of 03:30, and runs once
    assert [local(at) for at in spring] == ["2026-03-29T01:30:00+01:00", "2026-03-29T03:30:00+02:00"]
    autumn = occurrences(nightly, ms(2026, 10, 24, 22), ms(2026, 10, 25, 12), BERLIN)
    # 02:30 happens twice that night (summer time, then winter time): it runs once
    assert [local(at) for at in autumn] == ["2026-10-25T01:30:00+02:00", "2026-10-25T02:30:00+02:00",
                                            "2026-10-25T03:30:00+01:00"]


def test_every_process_computes_the_same_key_for_an_occurrence() -> None:
    entry = entry_of("sync", {"task": "t", "schedule": 60, "jitter": 30})
    at = ms(2030, 1, 1, 9, 0)
    first = key(entry, at)
    again = key(entry_of("sync", {"task": "t", "schedule": 60, "jitter": 30}), at)
    assert first == again
    assert first.ordering_id == "periodic:sync"
    assert first.uniqueness_key == "2030-01-01T09:00:00.000+00:00"
    assert at <= first.scheduled_ms < at + 30_000  # jittered, within the entry's jitter
    spread = {key(entry, at + n * 60_000).scheduled_ms - (at + n * 60_000) for n in range(50)}
    assert len(spread) > 10  # the jitter differs between occurrences
    plain = entry_of("sync", {"task": "t", "schedule": 60})
    assert key(plain, at).scheduled_ms == at


@pytest.mark.parametrize("partitions", [1, 6, 12, 64])
def test_an_allow_all_occurrence_has_an_ordering_id_of_its_own_in_the_entrys_partition(
        partitions: int) -> None:
    entry = entry_of("sync", {"task": "t", "schedule": 60, "overlap": "allow_all"})
    partition_of = functools.partial(partition_for, partitions=partitions)
    at = ms(2030, 1, 1, 9, 0)
    keys = [key(entry, at + n * 60_000, partition_of) for n in range(200)]
    assert len({k.ordering_id for k in keys}) == 200  # none waits for another
    assert {partition_of(k.ordering_id) for k in keys} == {partition_of(entry.ordering_id)}
    assert keys[0].ordering_id.startswith("periodic:sync@2030-01-01T09:00:00.000+00:00")
    assert keys == [key(entry, at + n * 60_000, partition_of) for n in range(200)]  # the same again
    assert {entry_name_of(k.ordering_id) for k in keys} == {"sync"}
    assert entry_name_of(entry.ordering_id) == "sync" and entry_name_of("customer-1") is None
    with pytest.raises(ValueError, match="allow_all: its keys need the topic's partitioner"):
        key(entry, at)


def test_an_entry_named_like_an_allow_all_occurrence_or_too_long_for_one_is_refused() -> None:
    with pytest.raises(PeriodicEntryError, match="must not end in '@' and a time"):
        entry_of("sync@2030-01-01T09:00:00.000+00:00#3", {"task": "t", "schedule": 60})
    entry_of("a" * 480, {"task": "t", "schedule": 60})  # its ordering id fits
    with pytest.raises(PeriodicEntryError, match="its runs' ordering id would be"):
        entry_of("a" * 480, {"task": "t", "schedule": 60, "overlap": "allow_all"})


@pytest.mark.parametrize(("catch_up", "missed"), [
    ("last", [ms(2030, 1, 1, 12, 0)]),
    ("all", [ms(2030, 1, 1, hour, 0) for hour in range(10, 13)]),
    ("none", []),
])
def test_after_downtime_the_entry_says_which_missed_occurrences_run(
        catch_up: str, missed: list[int]) -> None:
    hourly = entry_of("hourly", {"task": "t", "schedule": crontab(minute=0), "catch_up": catch_up})
    assert hourly.catch_up is CatchUp(catch_up)
    last, now = ms(2030, 1, 1, 9, 0), ms(2030, 1, 1, 12, 20)  # down from 9:00 to 12:20
    ahead = to_fire(hourly, last, now, 2 * 3_600_000, UTC)
    assert ahead == [*missed, ms(2030, 1, 1, 13, 0), ms(2030, 1, 1, 14, 0)]


def test_a_new_entry_catches_nothing_up_and_does_not_fire_at_once() -> None:
    entry = entry_of("new", {"task": "t", "schedule": 600})
    now = ms(2030, 1, 1, 9, 3)
    assert to_fire(entry, None, now, 600_000, UTC) == [ms(2030, 1, 1, 9, 10)]


def test_beat_schedule_entries_are_read_with_their_arguments_and_options() -> None:
    read = entries({
        "cleanup": {"task": "proj.cleanup", "schedule": 30.0, "args": (7,),
                    "kwargs": {"dry_run": False}, "options": {"queue": "maintenance"}},
        "report": {"task": "proj.report", "schedule": crontab(hour=7, minute=30)},
    }, known_tasks={"proj.cleanup", "proj.report"})
    assert [(e.name, e.task, e.args, dict(e.kwargs), dict(e.options)) for e in read] == [
        ("cleanup", "proj.cleanup", (7,), {"dry_run": False}, {"queue": "maintenance"}),
        ("report", "proj.report", (), {}, {})]


@pytest.mark.parametrize(("spec", "problem"), [
    ({"schedule": 10}, "'task' must be a task name"),
    ({"task": "proj.gone", "schedule": 10}, "task 'proj.gone' is not registered"),
    ({"task": "t"}, "it has no 'schedule'"),
    ({"task": "t", "schedule": "*/5 * * * *"}, "schedule must be seconds, a timedelta"),
    ({"task": "t", "schedule": 0}, "interval must be from 1 ms to 10 years"),
    ({"task": "t", "schedule": schedule(dt.timedelta(0))}, "interval must be positive"),
    ({"task": "t", "schedule": 10, "args": "abc"}, "'args' must be a list or tuple"),
    ({"task": "t", "schedule": 10, "args": [object()]}, "its args must be JSON values"),
    ({"task": "t", "schedule": 10, "kwargs": {1: 2}}, "'kwargs' must be a mapping with string keys"),
    ({"task": "t", "schedule": 10, "options": {"eta": dt.datetime(2030, 1, 1)}},
     "its options must be JSON values"),
    ({"task": "t", "schedule": 10, "relative": "yes"}, "'relative' must be True or False"),
    ({"task": "t", "schedule": 10, "catch_up": "some"}, "'catch_up' must be one of last, all, none"),
    ({"task": "t", "schedule": 10, "jitter": -1}, "'jitter' must be 0 to 86,400 seconds"),
    ({"task": "t", "schedule": 10, "shedule": 5}, "unknown key(s) shedule"),
])
def test_an_entry_that_cannot_run_is_refused_naming_it_and_what_is_wrong(
        spec: dict[str, Any], problem: str) -> None:
    with pytest.raises(PeriodicEntryError) as raised:
        entries({"ok": {"task": "t", "schedule": 10}, "broken": spec}, known_tasks={"t"})
    assert raised.value.entry == "broken"
    assert str(raised.value).startswith("periodic entry 'broken': ")
    assert problem in str(raised.value)
    assert isinstance(raised.value, ConfigurationError)  # one errors tree


def test_a_crontab_for_a_crontab_string_gets_a_clear_error_and_bad_celery_fields_celerys() -> None:
    with pytest.raises(ValueError):  # Celery's own parser refuses a malformed field
        crontab(minute="61")
    with pytest.raises(PeriodicEntryError, match="its name must be a non-empty string"):
        entries({"": {"task": "t", "schedule": 1}})
    with pytest.raises(PeriodicEntryError, match="it must be a mapping"):
        entries({"x": ["t", 1]})


def test_a_span_with_too_many_occurrences_is_refused_rather_than_filling_memory(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(periodic, "MAX_OCCURRENCES", 100)
    entry = entry_of("fast", {"task": "t", "schedule": 1})
    assert len(occurrences(entry, 0, 100_000, UTC)) == 100
    with pytest.raises(PeriodicEntryError, match="more than 100 occurrences"):
        occurrences(entry, 0, 101_000, UTC)


@pytest.mark.parametrize(("event", "latitude", "longitude"), [
    ("sunrise", 48.85, 2.35), ("sunset", -33.87, 151.21), ("solar_noon", 0.0, 0.0),
    ("dawn_astronomical", 60.0, 20.0), ("dusk_civil", 64.1, -21.9)])
def test_a_solar_event_fires_when_celerys_solar_says_to_the_millisecond(
        event: str, latitude: float, longitude: float) -> None:
    entry = entry_of("sun", {"task": "t", "schedule": solar(event, latitude, longitude)})
    start = dt.datetime(2030, 3, 28, 12, 0, tzinfo=UTC)  # across Europe's clock change
    found = occurrences(entry, int(start.timestamp() * 1000), ms(2030, 4, 7, 12), UTC)
    assert len(found) == 10  # one a day
    for before, at in itertools.pairwise([int(start.timestamp() * 1000), *found]):
        # Celery's own: the time left from a last run (just after the event before), to a
        # clock that reads that last run
        when = dt.datetime.fromtimestamp((before + 1) / 1000, UTC)
        celerys = solar(event, latitude, longitude, nowfun=lambda when=when: when)
        expected = when + celerys.remaining_estimate(when)
        assert abs(at - expected.timestamp() * 1000) < 1
    assert next_occurrence(entry, found[3], UTC) == found[4]


def test_a_solar_event_a_polar_day_skips_is_found_on_the_day_it_happens_again() -> None:
    # no sunrise at 89.5 N from the autumn equinox to the spring one
    entry = entry_of("sun", {"task": "t", "schedule": solar("sunrise", 89.5, 0)})
    assert occurrences(entry, ms(2030, 12, 1), ms(2031, 1, 1), UTC) == []
    first = next_occurrence(entry, ms(2030, 12, 1), UTC)
    assert first is not None and dt.datetime.fromtimestamp(first / 1000, UTC).month == 3
