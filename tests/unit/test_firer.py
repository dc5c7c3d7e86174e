"""The firer writes due occurrences through the ingest loop's write path and notes them in the
store: each occurrence becomes one pending task, a new owner goes on where the last one
stopped, and a store outage loses nothing."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from celery_scheduler.dispatcher.engine import Engine
from celery_scheduler.dispatcher.firer import Firer
from celery_scheduler.dispatcher.firing import Firing
from celery_scheduler.dispatcher.ingest import Ingest
from celery_scheduler.envelope import RetryPolicy
from celery_scheduler.partitioner import partition_for
from celery_scheduler.periodic import Entry
from celery_scheduler.periodic import key as periodic_key
from celery_scheduler.periodic_changes import definition_of
from celery_scheduler.periodic_entries import entry_of
from celery_scheduler.store.base import EntryChange, State
from celery_scheduler.store.fencing import FencedTimestamps
from celery_scheduler.store.memory import MemoryScheduleStore
from tests.unit.fakes import PARTITIONS, OutageStore

UTC = dt.timezone.utc
NINE = int(dt.datetime(2030, 1, 1, 9, 0, tzinfo=UTC).timestamp() * 1000)
MINUTE = 60_000
ENTRY = entry_of("report", {"task": "proj.report", "schedule": 60, "args": [1],
                            "options": {"queue": "reports"}})
HOME = partition_for(ENTRY.ordering_id, PARTITIONS)


class Clock:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


def firer(store: MemoryScheduleStore, clock: Clock, owner: str = "d1", ahead_ms: int = 5_000,
          code: Sequence[Entry] = (), entry: Entry = ENTRY,
          may_write: Callable[[int], bool] = lambda partition: True,
          certain: Callable[[int], bool] | None = None) -> tuple[Firer, Engine]:
    engine = Engine(store, lambda task, release: None, owner, clock=clock)
    ingest = Ingest(consumer=None, store=store, engine=engine,  # type: ignore[arg-type]
                    dead_letters=None, partitions=lambda: PARTITIONS,  # type: ignore[arg-type]
                    clock=clock)
    plan = Firing([entry], lambda o: partition_for(o, PARTITIONS), UTC, ahead_ms=ahead_ms)
    return Firer(plan, store, ingest.apply, may_write, lambda task: RetryPolicy(),
                 clock=clock, code=code, certain=certain), engine


def pending_times(store: MemoryScheduleStore) -> list[int]:
    return sorted(s.key.scheduled_ms for s in store.statuses_in_state(State.PENDING, 100)
                  if s.key.ordering_id == ENTRY.ordering_id)


def test_each_due_occurrence_becomes_one_pending_task_of_the_entry() -> None:
    store, clock = MemoryScheduleStore(), Clock(NINE + 30_000)
    fire, _ = firer(store, clock)
    assert fire.step() == 0  # 9:01 is 30 s away
    clock.ms = NINE + MINUTE - 3_000
    assert fire.step() == 1
    assert fire.step() == 0  # written once
    [status] = store.statuses_in_state(State.PENDING, 10)
    task = store.task(status.key)
    assert task is not None
    envelope = task.envelope
    assert (envelope.task, envelope.args, envelope.options) == ("proj.report", [1], {"queue": "reports"})
    assert envelope.key.scheduled_ms == NINE + MINUTE
    assert store.last_fired(HOME) == {"report": NINE + MINUTE}


def test_a_new_owner_goes_on_from_what_the_store_says_was_fired() -> None:
    store, clock = MemoryScheduleStore(), Clock(NINE)
    first, _ = firer(store, clock, "d1")
    for minute in (1, 2):
        clock.ms = NINE + minute * MINUTE - 3_000
        first.step()
    # d1 dies; d2 takes the partition 30 s after 9:03 fell due: it runs, late
    clock.ms = NINE + 3 * MINUTE + 30_000
    second, _ = firer(store, clock, "d2")
    assert second.step() == 1
    clock.ms = NINE + 4 * MINUTE - 3_000
    assert second.step() == 1
    assert pending_times(store) == [NINE + m * MINUTE for m in (1, 2, 3, 4)]


def test_a_store_outage_is_said_once_and_the_occurrence_fires_once_it_is_over(
        caplog: pytest.LogCaptureFixture) -> None:
    store, clock = OutageStore("apply", "last_fired"), Clock(NINE + MINUTE - 3_000)
    fire, _ = firer(store, clock)
    store.down = True
    with caplog.at_level(logging.WARNING, logger="celery_scheduler.dispatcher.firer"):
        assert fire.step() == 0
        assert fire.step() == 0
        store.down = False
        assert fire.step() == 1
    said = [r.getMessage() for r in caplog.records]
    assert len([m for m in said if "could not fire" in m]) == 1
    assert len([m for m in said if "fire again" in m]) == 1
    assert pending_times(store) == [NINE + MINUTE]


@pytest.mark.parametrize(("overlap", "state", "written"), [
    ("buffer_all", "released", True), ("buffer_all", "pending", True),
    ("buffer_one", "released", True), ("buffer_one", "pending", False),
    ("skip", "released", False), ("skip", "pending", False),
    ("skip", "succeeded", True), ("buffer_one", "succeeded", True),
    ("allow_all", "released", True), ("allow_all", "pending", True),
])
def test_the_overlap_policy_looks_at_the_run_before(overlap: str, state: str, written: bool) -> None:
    entry = entry_of("report", {"task": "proj.report", "schedule": 60, "overlap": overlap})
    store, clock = MemoryScheduleStore(), Clock(NINE + MINUTE)
    fire, _ = firer(store, clock, entry=entry)
    assert fire.step() == 0  # 9:02 is a minute away (and the looking kinds wait for their time)
    clock.ms = NINE + 2 * MINUTE
    assert fire.step() == 1  # nothing before it: written
    previous = store.task(periodic_key(entry, NINE + 2 * MINUTE, lambda o: partition_for(o, PARTITIONS)))
    assert previous is not None
    if state == "released":
        store.mark_released_many([(previous, 1, NINE + 10 * MINUTE)], clock.ms)
    elif state == "succeeded":
        store.mark_released_many([(previous, 1, NINE + 10 * MINUTE)], clock.ms)
        store.finish_many([previous], State.SUCCEEDED, clock.ms)
    clock.ms = NINE + 3 * MINUTE
    assert fire.step() == int(written)
    assert store.last_fired(HOME) == {"report": NINE + 3 * MINUTE}  # skipped or not, done with


class LeaseLostWhileReading(MemoryScheduleStore):
    """Once *losing*, the firer's process loses its lease while it reads statuses."""

    def __init__(self) -> None:
        super().__init__()
        self.losing = False
        self.held = True

    def statuses(self, keys: Any) -> Any:
        found = super().statuses(keys)
        if self.losing:
            self.held = False
        return found


@pytest.mark.parametrize("checked", [True, False])
def test_a_decision_is_not_written_once_the_lease_is_lost_while_reading(
        checked: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The long chaos run: a dispatcher stopped (SIGSTOP) while it read the run before of a
    buffer_one entry's occurrence; the next owner skipped it, as the run before had not
    started; the first one woke, found that run started since, and fired it, after the
    owner had decided. The broken variant (*checked* False) asks for the lease only before."""
    if not checked:
        monkeypatch.setattr(Firer, "_still_held", lambda self, due, written: (due, written))
    entry = entry_of("report", {"task": "proj.report", "schedule": 60, "overlap": "buffer_one"})
    store, clock = LeaseLostWhileReading(), Clock(NINE + MINUTE)
    # the second chaos run: paused past its lease, the process is not yet told it lost it
    # (may_write still says yes); only its own clock says the lease is over
    fire, _ = firer(store, clock, entry=entry, certain=lambda partition: store.held)
    assert fire.step() == 0
    clock.ms = NINE + 2 * MINUTE
    assert fire.step() == 1  # nothing before it
    previous = store.task(periodic_key(entry, NINE + 2 * MINUTE, lambda o: partition_for(o, PARTITIONS)))
    assert previous is not None
    store.mark_released_many([(previous, 1, NINE + 10 * MINUTE)], clock.ms)  # started meanwhile
    clock.ms = NINE + 3 * MINUTE
    store.losing = True
    assert fire.step() == (0 if checked else 1)
    assert (store.last_fired(HOME) == {"report": NINE + 2 * MINUTE}) is checked  # nor noted


class LeaseEndsWhileWriting(MemoryScheduleStore):
    """Stamps each write as the Cassandra store does (see fencing.py); once *ending*, the
    lease of every partition ends right after the firer's second ask, before its write."""

    def __init__(self) -> None:
        super().__init__()
        self.ending = False
        self.ended = False
        self.stamps = FencedTimestamps()
        self.stamps.fence = lambda partition: 0.0 if self.ended else None

    def certain(self, partition: int) -> bool:
        self.ended = self.ending  # paused right after the answer
        return True

    def refusing_late_writes(self) -> Any:
        return self.stamps.refusing_late()

    def _stamp(self, partition: int) -> None:
        with self.stamps.writing(partition):
            self.stamps()

    def apply(self, operations: Any, now_ms: int) -> Any:
        for operation in operations:
            self._stamp(operation.partition)
        return super().apply(operations, now_ms)

    def note_fired(self, partition: int, fired: Any) -> None:
        self._stamp(partition)
        super().note_fired(partition, fired)


@pytest.mark.parametrize("refused", [True, False])
def test_a_decision_is_not_written_once_the_lease_ends_while_writing(
        refused: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A pause after the second ask and before the write is sent: the write would be held
    at the lease's end, and stay where the next owner decided otherwise and wrote nothing.
    The broken variant (*refused* False) sends it, stamped at the fence."""
    entry = entry_of("report", {"task": "proj.report", "schedule": 60, "overlap": "buffer_one"})
    store, clock = LeaseEndsWhileWriting(), Clock(NINE + MINUTE)
    if not refused:
        monkeypatch.setattr(store, "refusing_late_writes", contextlib.nullcontext)
    fire, _ = firer(store, clock, entry=entry, certain=store.certain)
    assert fire.step() == 0  # 9:02 is a minute away
    clock.ms = NINE + 2 * MINUTE
    assert fire.step() == 1
    previous = store.task(periodic_key(entry, NINE + 2 * MINUTE, lambda o: partition_for(o, PARTITIONS)))
    assert previous is not None
    store.mark_released_many([(previous, 1, NINE + 10 * MINUTE)], clock.ms)  # it started
    clock.ms = NINE + 3 * MINUTE
    store.ending = True
    with caplog.at_level(logging.WARNING, logger="celery_scheduler.dispatcher.firer"):
        assert fire.step() == (0 if refused else 1)
    assert (pending_times(store) == []) is refused  # 9:02 released; 9:03 not written
    assert (store.last_fired(HOME) == {"report": NINE + 2 * MINUTE}) is refused  # nor noted
    said = [r.getMessage() for r in caplog.records]
    assert any("did not fire" in m and "lease of the partition ended" in m for m in said) is refused


def test_allow_all_occurrences_have_ordering_ids_of_their_own_in_the_entrys_partition() -> None:
    entry = entry_of("sync", {"task": "proj.sync", "schedule": 60, "overlap": "allow_all"})
    home = partition_for(entry.ordering_id, PARTITIONS)
    store, clock = MemoryScheduleStore(), Clock(NINE + 30_000)
    fire, _ = firer(store, clock, entry=entry)
    for minute in range(1, 6):
        clock.ms = NINE + minute * MINUTE - 4_000  # written ahead, as buffer_all's are
        assert fire.step() == 1
    pending = store.statuses_in_state(State.PENDING, 100)
    ordering_ids = {s.key.ordering_id for s in pending}
    assert len(ordering_ids) == 5  # none waits for another
    assert all(o.startswith("periodic:sync@2030-01-01T09:0") for o in ordering_ids)
    assert {s.partition for s in pending} == {home}
    assert {partition_for(o, PARTITIONS) for o in ordering_ids} == {home}


def ahead_firer(store: MemoryScheduleStore, clock: Clock) -> Firer:
    """A firer of ENTRY (in the code) writing its occurrences 150 s ahead: two wait at a time."""
    return firer(store, clock, ahead_ms=150_000, code=[ENTRY])[0]


def test_a_paused_entry_cancels_what_it_wrote_ahead_and_fires_nothing_more() -> None:
    store, clock = MemoryScheduleStore(), Clock(NINE + 1_000)
    fire = ahead_firer(store, clock)
    assert fire.step() + fire.step() == 2  # one occurrence of an entry a step
    assert pending_times(store) == [NINE + MINUTE, NINE + 2 * MINUTE]
    store.change_entry(EntryChange("report", paused=True, updated_ms=clock.ms))
    clock.ms += 3_000  # changes are read every two seconds
    fire.step()
    assert pending_times(store) == []
    for at in (NINE + MINUTE, NINE + 2 * MINUTE):
        status = store.status(periodic_key(ENTRY, at))
        assert status is not None and status.state is State.CANCELLED
    clock.ms += 5 * MINUTE
    assert fire.step() == 0


def test_a_changed_entry_rewrites_the_occurrences_it_still_has_and_cancels_the_others() -> None:
    store, clock = MemoryScheduleStore(), Clock(NINE + 1_000)
    fire = ahead_firer(store, clock)
    assert fire.step() + fire.step() == 2  # one occurrence of an entry a step
    # now every two minutes, with other arguments: 9:02 is still an occurrence, 9:01 is not
    store.change_entry(EntryChange("report", definition=definition_of(
        "report", {"task": "proj.report", "schedule": 120, "args": [2]}), updated_ms=clock.ms))
    clock.ms += 3_000
    fire.step()
    assert pending_times(store) == [NINE + 2 * MINUTE]
    gone = store.status(periodic_key(ENTRY, NINE + MINUTE))
    assert gone is not None and gone.state is State.CANCELLED
    task = store.task(periodic_key(ENTRY, NINE + 2 * MINUTE))
    assert task is not None and task.envelope.args == [2]
    clock.ms = NINE + 3 * MINUTE
    fire.step()
    assert pending_times(store) == [NINE + 2 * MINUTE, NINE + 4 * MINUTE]


def test_a_new_owner_looks_past_an_occurrence_the_owner_before_skipped() -> None:
    """The store notes a skipped occurrence as fired, but nothing of it was written: a new
    owner finds the run before among the occurrences before it, and skips while it goes on."""
    entry = entry_of("report", {"task": "proj.report", "schedule": 60, "overlap": "skip"})
    store, clock = MemoryScheduleStore(), Clock(NINE + MINUTE)
    old, _ = firer(store, clock, entry=entry)
    assert old.step() == 0  # taken: it fires from 9:02
    clock.ms = NINE + 2 * MINUTE
    assert old.step() == 1
    running = store.task(periodic_key(entry, NINE + 2 * MINUTE))
    assert running is not None
    store.mark_released_many([(running, 1, NINE + 10 * MINUTE)], clock.ms)
    clock.ms = NINE + 3 * MINUTE
    assert old.step() == 0  # skipped: 9:02 still runs
    assert store.last_fired(HOME) == {"report": NINE + 3 * MINUTE}
    new, _ = firer(store, clock, owner="d2", entry=entry)  # the partition changed hands
    clock.ms = NINE + 4 * MINUTE
    assert new.step() == 0  # 9:02 still runs: 9:04 is skipped too
    store.finish_many([running], State.SUCCEEDED, clock.ms)
    clock.ms = NINE + 5 * MINUTE
    assert new.step() == 1


def test_an_owner_that_takes_a_partition_back_looks_at_the_run_fired_meanwhile() -> None:
    """Its own last occurrence is not the run before once another dispatcher fired since:
    what it wrote before it lost the partition is forgotten with the partition."""
    entry = entry_of("report", {"task": "proj.report", "schedule": 60, "overlap": "skip"})
    store, clock = MemoryScheduleStore(), Clock(NINE + MINUTE)
    holder = {"d1": True, "d2": False}
    d1, _ = firer(store, clock, entry=entry, may_write=lambda p: holder["d1"])
    d2, _ = firer(store, clock, owner="d2", entry=entry, may_write=lambda p: holder["d2"])
    assert d1.step() == 0
    clock.ms = NINE + 2 * MINUTE
    assert d1.step() == 1  # 9:02, which runs and ends
    first = store.task(periodic_key(entry, NINE + 2 * MINUTE))
    assert first is not None
    store.mark_released_many([(first, 1, NINE + 10 * MINUTE)], clock.ms)
    store.finish_many([first], State.SUCCEEDED, clock.ms)
    holder.update(d1=False, d2=True)  # the partition goes to d2, which fires 9:03
    assert d1.step() == 0
    clock.ms = NINE + 3 * MINUTE
    assert d2.step() == 1
    running = store.task(periodic_key(entry, NINE + 3 * MINUTE))
    assert running is not None
    store.mark_released_many([(running, 1, NINE + 10 * MINUTE)], clock.ms)
    holder.update(d1=True, d2=False)  # and comes back to d1 while 9:03 still runs
    assert d2.step() == 0
    clock.ms = NINE + 4 * MINUTE
    assert d1.step() == 0  # 9:04 skipped: 9:03 runs (not 9:02, d1's own, which ended)
    store.finish_many([running], State.SUCCEEDED, clock.ms)
    clock.ms = NINE + 5 * MINUTE
    assert d1.step() == 1
