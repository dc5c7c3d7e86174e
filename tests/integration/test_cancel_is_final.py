"""A cancel is final: a schedule record read again after its cancel does not revive the task.

Kafka delivers at least once: a dispatcher that could not commit a batch (Kafka restarted)
or a new owner after a rebalance reads the schedule record again after its cancel was
applied. The chaos run found the task then ran (``scripts/chaos --quick``, seed 1).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from celery_scheduler.dispatcher.engine import Engine
from celery_scheduler.dispatcher.ingest import Ingest
from celery_scheduler.keys import TaskKey
from celery_scheduler.store.base import Cancel, Cursor, Put, ScheduleStore, State
from celery_scheduler.store.cassandra import CassandraScheduleStore
from celery_scheduler.tasklog.dead_letters import MemoryDeadLetters
from tests.integration.test_store_contract import NOW, B, envelope
from tests.integration.test_store_contract import store as store  # the fixture: both stores
from tests.integration.test_write_fencing import stores as stores  # two Cassandra stores


def test_a_schedule_record_read_again_after_its_cancel_is_ignored(store: ScheduleStore) -> None:
    task = envelope("a", NOW)
    assert store.apply([Put(2, task)], NOW) != [None]
    assert store.apply([Cancel(2, task.key)], NOW + 1) == [True]

    # the same batch, re-read: the schedule record comes back first, then its cancel
    assert store.apply([Put(2, task)], NOW + 2) == [None]
    assert store.put(2, task, NOW + 3) is None
    assert store.apply([Cancel(2, task.key)], NOW + 4) == [False]

    assert store.read(2, Cursor(B), 10) == []
    status = store.status(task.key)
    assert status is not None and status.state is State.CANCELLED


def test_the_engine_never_sees_the_revived_task(store: ScheduleStore) -> None:
    released = []
    engine = Engine(store, lambda task, release: released.append(task.key), "owner",
                    clock=lambda: NOW + 10_000)
    engine.assign([2])
    task = envelope("a", NOW)
    store.put(2, task, NOW)
    store.cancel(2, task.key, NOW + 1)
    store.put(2, task, NOW + 2)  # read again after the cancel

    for _ in range(5):
        engine.step()

    assert released == []


class Dispatcher:
    """One dispatcher's engine and ingest loop over *store*, stepped by the test."""

    def __init__(self, store: ScheduleStore) -> None:
        self.store = store
        self.now = NOW - 5_000
        self.released: list[TaskKey] = []
        self.engine = Engine(store, lambda task, release: self.released.append(task.key), "owner",
                             clock=lambda: self.now)
        self.ingest = Ingest(None, store, self.engine, MemoryDeadLetters(),  # type: ignore[arg-type]
                             lambda: 8, clock=lambda: self.now)
        self.task = envelope("a", NOW)
        self.engine.assign([2])
        assert store.put(2, self.task, self.now) is not None
        self.engine.step()  # takes partition 2's lease and loads the task, not due yet
        assert self.task.key in self.engine.timetable and self.released == []

    def cancel(self) -> None:
        self.ingest.apply([Cancel(2, self.task.key)])

    def apply_falling_due_after_the_read(self, operation: Put | Cancel,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
        """Apply *operation*; the task falls due between its status read and its write."""
        read = self.store.statuses

        def read_then_step(keys: Any) -> Any:
            statuses = read(keys)
            self.due_step()
            return statuses

        monkeypatch.setattr(self.store, "statuses", read_then_step)
        self.ingest.apply([operation])
        monkeypatch.undo()
        for _ in range(3):
            self.due_step()

    def due_step(self) -> None:
        self.now = NOW + 10_000
        self.engine.step()

    def state(self) -> State:
        status = self.store.status(self.task.key)
        assert status is not None
        return status.state


@pytest.mark.cassandra
def test_a_release_due_between_a_cancels_read_and_its_write_waits_for_it(
        stores: tuple[CassandraScheduleStore, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    # Cassandra's apply reads every status first, then writes: the gap the chaos run's
    # "cancelled but ran" keys fell into (the engine marked the task released in it, and
    # the cancel overwrote the marking)
    dispatcher = Dispatcher(stores[0])
    dispatcher.apply_falling_due_after_the_read(Cancel(2, dispatcher.task.key), monkeypatch)

    assert dispatcher.released == []
    assert dispatcher.state() is State.CANCELLED
    assert dispatcher.engine.claims.unsettled_cancels() == 0


@pytest.mark.cassandra
def test_a_schedule_record_read_again_as_its_task_falls_due_does_not_reset_it(
        stores: tuple[CassandraScheduleStore, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    # the same gap for a put: written after a marking, it would make a running task pending
    dispatcher = Dispatcher(stores[0])
    dispatcher.apply_falling_due_after_the_read(Put(2, dispatcher.task), monkeypatch)

    assert dispatcher.released == [dispatcher.task.key]
    assert dispatcher.state() is State.RELEASED


def test_a_cancel_written_as_the_engine_takes_its_task_due_stops_it(store: ScheduleStore) -> None:
    # The engine took the task due from memory; the cancel is written, and its event queued,
    # before the engine marks it released: the marking would overwrite the cancel.
    dispatcher = Dispatcher(store)
    claims = dispatcher.engine.claims
    take = claims.take_for_release

    def cancel_then_take(keys: Any) -> set[TaskKey]:
        dispatcher.cancel()
        return take(keys)

    claims.take_for_release = cancel_then_take  # type: ignore[method-assign]
    dispatcher.due_step()
    claims.take_for_release = take  # type: ignore[method-assign]
    dispatcher.due_step()

    assert dispatcher.released == []
    assert dispatcher.state() is State.CANCELLED
    assert dispatcher.task.key not in dispatcher.engine.timetable


def test_a_cancel_read_while_its_task_is_marked_released_comes_too_late(
        store: ScheduleStore, monkeypatch: pytest.MonkeyPatch) -> None:
    dispatcher = Dispatcher(store)
    mark = store.mark_released_and_succeeded  # the engine marks its releases through this
    cancels: list[threading.Thread] = []
    waited: list[bool] = []

    def mark_while_cancelling(*args: Any) -> None:
        cancels.append(threading.Thread(target=dispatcher.cancel))
        cancels[0].start()
        cancels[0].join(0.5)
        waited.append(cancels[0].is_alive())  # the cancel waits for the marking ...
        mark(*args)

    monkeypatch.setattr(store, "mark_released_and_succeeded", mark_while_cancelling)
    dispatcher.due_step()
    monkeypatch.undo()
    cancels[0].join(10)
    assert not cancels[0].is_alive()
    dispatcher.due_step()

    assert waited == [True]
    # ... then reads "released" and leaves it: the task runs, as its status says
    assert dispatcher.released == [dispatcher.task.key]
    assert dispatcher.state() is State.RELEASED
