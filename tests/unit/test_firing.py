"""The firing plan of periodic entries: which dispatcher fires an entry, which occurrences it
schedules when it takes a partition, and that a hand-over neither repeats nor skips one."""

from __future__ import annotations

import datetime as dt
import tracemalloc

import pytest
from celery.schedules import crontab

from celery_scheduler.dispatcher.firing import Firing, Occurrence
from celery_scheduler.partitioner import partition_for
from celery_scheduler.periodic import Entry
from celery_scheduler.periodic_entries import entry_of

UTC = dt.timezone.utc
PARTITIONS = 6
MINUTE = 60_000


def ms(*parts: int) -> int:
    return int(dt.datetime(*parts, tzinfo=UTC).timestamp() * 1000)


def partition_of(ordering_id: str) -> int:
    return partition_for(ordering_id, PARTITIONS)


def firing(*entries: Entry, ahead_ms: int = 5_000) -> Firing:
    return Firing(entries, partition_of, UTC, ahead_ms)


def every_minute(name: str = "tick", **spec: object) -> Entry:
    return entry_of(name, {"task": "t", "schedule": 60, **spec})


def times(occurrences: list[Occurrence]) -> list[int]:
    return [o.at_ms for o in occurrences]


def test_an_entry_fires_only_where_its_partition_may_be_written() -> None:
    entry = every_minute()
    home = partition_of(entry.ordering_id)
    plan = firing(entry)
    assert plan.partitions == {home}
    assert plan.to_take(p for p in range(PARTITIONS) if p != home) == []
    assert plan.to_take(range(PARTITIONS)) == [home]
    assert plan.due(ms(2030, 1, 1, 9, 0, 59)) == []  # not taken: nothing is due here


def test_a_new_entry_fires_at_its_next_occurrence_and_stays_due_until_written() -> None:
    entry = every_minute()
    home = partition_of(entry.ordering_id)
    plan = firing(entry)
    now = ms(2030, 1, 1, 9, 0, 30)
    plan.taken(home, {}, now)
    assert plan.to_take([home]) == []
    assert plan.due(now) == []  # 9:01 is more than five seconds away
    now = ms(2030, 1, 1, 9, 0, 56)
    [occurrence] = plan.due(now)
    assert (occurrence.partition, occurrence.at_ms) == (home, ms(2030, 1, 1, 9, 1))
    assert plan.key_of(occurrence.entry, occurrence.at_ms).ordering_id == "periodic:tick"
    assert plan.due(now) == [occurrence]  # not written yet: still due
    assert plan.fired([occurrence]) == {home: {"tick": ms(2030, 1, 1, 9, 1)}}
    assert plan.due(now) == []
    assert times(plan.due(ms(2030, 1, 1, 9, 1, 56))) == [ms(2030, 1, 1, 9, 2)]


@pytest.mark.parametrize("catch_up", ["last", "all", "none"])
def test_what_fell_due_less_than_two_minutes_ago_runs_whatever_catch_up_says(catch_up: str) -> None:
    every_20s = entry_of("often", {"task": "t", "schedule": 20, "catch_up": catch_up})
    home = partition_of(every_20s.ordering_id)
    plan = firing(every_20s, ahead_ms=0)
    # the last owner fired 9:00:00; this one takes over at 9:03:05
    plan.taken(home, {"often": ms(2030, 1, 1, 9, 0)}, ms(2030, 1, 1, 9, 3, 5))
    recent = [ms(2030, 1, 1, 9, 1, 20), ms(2030, 1, 1, 9, 1, 40), ms(2030, 1, 1, 9, 2),
              ms(2030, 1, 1, 9, 2, 20), ms(2030, 1, 1, 9, 2, 40), ms(2030, 1, 1, 9, 3)]
    older = {"last": [], "all": [ms(2030, 1, 1, 9, 0, 20), ms(2030, 1, 1, 9, 0, 40),
                                 ms(2030, 1, 1, 9, 1)], "none": []}[catch_up]
    assert times(plan.due(ms(2030, 1, 1, 9, 3, 5))) == older + recent


@pytest.mark.parametrize(("catch_up", "caught_up"), [
    ("last", [ms(2030, 1, 1, 12, 0)]),
    ("all", [ms(2030, 1, 1, hour, 0) for hour in (10, 11, 12)]),
    ("none", []),
])
def test_a_partition_taken_after_downtime_catches_up_as_the_entry_says(
        catch_up: str, caught_up: list[int]) -> None:
    hourly = entry_of("hourly", {"task": "t", "schedule": crontab(minute=0), "catch_up": catch_up})
    home = partition_of(hourly.ordering_id)
    plan = firing(hourly)
    plan.taken(home, {"hourly": ms(2030, 1, 1, 9, 0)}, ms(2030, 1, 1, 12, 20))
    assert times(plan.due(ms(2030, 1, 1, 12, 20))) == caught_up
    plan.fired(plan.due(ms(2030, 1, 1, 12, 20)))
    assert plan.due(ms(2030, 1, 1, 12, 20)) == []
    assert times(plan.due(ms(2030, 1, 1, 12, 59, 58))) == [ms(2030, 1, 1, 13, 0)]


def test_a_hand_over_neither_fires_again_nor_skips_an_occurrence() -> None:
    entry = every_minute()
    home = partition_of(entry.ordering_id)
    store: dict[str, int] = {}  # what the store keeps of what was fired
    first = firing(entry)
    first.taken(home, store, ms(2030, 1, 1, 9, 0, 0))
    fired = []
    for minute in range(1, 4):
        due = first.due(ms(2030, 1, 1, 9, minute - 1, 57))
        fired += times(due)
        store |= first.fired(due).get(home, {})
    first.dropped([home])
    assert first.due(ms(2030, 1, 1, 9, 3, 57)) == []  # dropped: it fires nothing more
    # the next owner takes the partition 90 s later: 9:04 and 9:05 fell due meanwhile, a
    # hand-over's gap: both run, whatever catch_up says
    second = firing(entry)
    second.taken(home, store, ms(2030, 1, 1, 9, 5, 30))
    due = second.due(ms(2030, 1, 1, 9, 5, 30))
    assert times(due) == [ms(2030, 1, 1, 9, 4), ms(2030, 1, 1, 9, 5)]
    fired += times(due)
    second.fired(due)
    fired += times(second.due(ms(2030, 1, 1, 9, 5, 57)))
    assert fired == [ms(2030, 1, 1, 9, m) for m in range(1, 7)]
    assert len(set(fired)) == len(fired)


def test_an_owner_that_died_before_it_noted_a_fire_makes_the_next_fire_it_under_the_same_key(
        ) -> None:
    entry = every_minute()
    home = partition_of(entry.ordering_id)
    first = firing(entry)
    first.taken(home, {}, ms(2030, 1, 1, 9, 0, 0))
    [written] = first.due(ms(2030, 1, 1, 9, 0, 57))  # written, then the process died
    second = firing(entry)
    second.taken(home, {}, ms(2030, 1, 1, 9, 0, 58))
    [again] = second.due(ms(2030, 1, 1, 9, 0, 58))
    # the store's dedupe runs it once
    assert second.key_of(again.entry, again.at_ms) == first.key_of(written.entry, written.at_ms)


def test_the_entries_of_a_dropped_partition_stop_and_the_others_go_on() -> None:
    names = [f"e{n}" for n in range(40)]
    entries = [every_minute(name) for name in names]
    plan = firing(*entries)
    for partition in plan.partitions:
        plan.taken(partition, {}, ms(2030, 1, 1, 9, 0, 0))
    lost = min(plan.partitions)
    plan.dropped([lost])
    due = plan.due(ms(2030, 1, 1, 9, 0, 57))
    assert {o.entry.name for o in due} == {e.name for e in entries
                                           if partition_of(e.ordering_id) != lost}
    assert all(o.partition != lost for o in due)
    assert plan.fired(due) and plan.due(ms(2030, 1, 1, 9, 0, 57)) == []


def test_a_fire_noted_after_its_partition_was_dropped_is_left_to_the_new_owner() -> None:
    entry = every_minute()
    home = partition_of(entry.ordering_id)
    plan = firing(entry)
    plan.taken(home, {}, ms(2030, 1, 1, 9, 0, 0))
    due = plan.due(ms(2030, 1, 1, 9, 0, 57))
    plan.dropped([home])
    assert plan.fired(due) == {}


def test_with_thousands_of_entries_only_the_due_ones_come_out() -> None:
    entries = [entry_of(f"e{n}", {"task": "t", "schedule": 3600}) for n in range(5_000)]
    plan = firing(*entries)
    for partition in plan.partitions:
        plan.taken(partition, {}, ms(2030, 1, 1, 9, 0, 1))
    assert plan.due(ms(2030, 1, 1, 9, 30)) == []
    due = plan.due(ms(2030, 1, 1, 9, 59, 56))
    assert len(due) == 5_000 and set(times(due)) == {ms(2030, 1, 1, 10, 0)}


def test_an_entry_changed_at_run_time_is_taken_again_and_fires_each_occurrence_once() -> None:
    entry = every_minute()
    home = partition_of(entry.ordering_id)
    plan = firing(entry)
    plan.taken(home, {}, ms(2030, 1, 1, 9, 0, 30))
    every_two = entry_of("tick", {"task": "t", "schedule": crontab(minute="*/2")})
    plan.update([every_two], {})  # its next occurrence, 9:02, is the old one's second
    assert plan.to_take([home]) == [home]
    plan.taken(home, {}, ms(2030, 1, 1, 9, 0, 40))
    assert times(plan.due(ms(2030, 1, 1, 9, 1, 54))) == []
    assert times(plan.due(ms(2030, 1, 1, 9, 1, 57))) == [ms(2030, 1, 1, 9, 2)]  # once
    plan.update([every_two], {"tick": ms(2030, 1, 1, 9, 5)})  # resumed at 9:05
    plan.taken(home, {"tick": ms(2030, 1, 1, 9, 2)}, ms(2030, 1, 1, 9, 5, 10))
    assert times(plan.due(ms(2030, 1, 1, 9, 5, 10))) == []  # 9:04 was before the resume
    assert times(plan.due(ms(2030, 1, 1, 9, 5, 57))) == [ms(2030, 1, 1, 9, 6)]
    plan.update([], {})
    assert plan.partitions == frozenset() and plan.due(ms(2030, 1, 1, 9, 7, 57)) == []


def test_many_entries_of_one_crontab_cost_little_memory_and_all_fire() -> None:
    """A dispatcher holds every entry and its next occurrence: 20,000 entries that share a
    crontab take under 500 bytes each, their names and args included (Entry without a
    __dict__, one empty mapping for the kwargs and options they lack, one heap item for the
    time they share), and each fires."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        every = crontab()
        entries = [entry_of(f"e{i}", {"task": "t", "schedule": every, "args": [i]})
                   for i in range(20_000)]
        plan = firing(*entries)
        now = ms(2030, 1, 1, 9, 0, 30)
        for partition in plan.to_take(range(PARTITIONS)):
            plan.taken(partition, {}, now)
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert used / len(entries) < 500, f"{used / len(entries):.0f} bytes an entry"
    assert plan.next_at() == ms(2030, 1, 1, 9, 0, 55)
    due = plan.due(ms(2030, 1, 1, 9, 0, 55))
    assert sorted(o.entry.name for o in due) == sorted(e.name for e in entries)
    plan.fired(due)
    assert plan.next_at() == ms(2030, 1, 1, 9, 1, 55)
