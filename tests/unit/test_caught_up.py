"""A cancel acknowledged before a task was due wins: the engine marks a task released only
once its partition's ingest has applied everything acknowledged before then (caught_up.py).

The chaos run found tasks that ran although their cancel had been in Kafka for seconds: a
dispatcher that took the partition over released them from the store while it was still
reading the partition's records from the committed offset.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import pytest

from celery_scheduler.dispatcher.caught_up import (
    ASK_AGAIN_AFTER_FAILURE_MS,
    ASK_EVERY_MS,
    KEEP_ASKING_MS,
    CaughtUp,
)
from celery_scheduler.dispatcher.engine import Engine
from celery_scheduler.dispatcher.ingest import Ingest
from celery_scheduler.dispatcher.state import EngineSettings
from celery_scheduler.envelope import CancelEnvelope, ScheduleEnvelope, encode
from celery_scheduler.errors import TaskLogUnavailableError
from celery_scheduler.keys import TaskKey
from celery_scheduler.partitioner import partition_for
from celery_scheduler.store.base import State
from celery_scheduler.store.memory import MemoryScheduleStore
from celery_scheduler.tasklog.dead_letters import MemoryDeadLetters
from celery_scheduler.tasklog.memory import MemoryTaskLog, MemoryTaskLogReader
from tests.unit.test_engine import Clock

NOW = 1_700_000_000_000
PARTITIONS = 4
TOPIC = "t"


def test_a_partition_is_caught_up_to_when_its_end_was_asked_once_that_end_is_applied() -> None:
    caught_up = CaughtUp()
    assert not caught_up.covers(1, NOW, NOW)
    assert caught_up.to_ask([0, 1], NOW) == [1]  # only what the engine waits for
    caught_up.asked(1, NOW + 10, 7)
    assert caught_up.to_ask([0, 1], NOW + 10 + ASK_EVERY_MS - 1) == []
    assert caught_up.waiting()  # an answer waits to be applied: the ingest loop hurries
    caught_up.applied(1, 6)
    assert not caught_up.covers(1, NOW, NOW + 20)
    caught_up.applied(1, 7)
    assert caught_up.covers(1, NOW + 10, NOW + 30)
    assert not caught_up.covers(1, NOW + 11, NOW + 30)  # acknowledged after the ask: unknown
    assert not caught_up.waiting()
    assert caught_up.to_ask([0, 1], NOW + 30 + ASK_EVERY_MS) == [1]  # asked again, a busy partition
    assert caught_up.to_ask([0, 1], NOW + 30 + KEEP_ASKING_MS) == []  # long not waited for
    caught_up.forget([1])
    assert not caught_up.covers(1, NOW, NOW + 40)


def test_later_answers_wait_behind_earlier_ones() -> None:
    caught_up = CaughtUp()
    caught_up.covers(1, NOW, NOW)
    caught_up.asked(1, NOW + 10, 7)
    caught_up.asked(1, NOW + 60, 9)
    caught_up.applied(1, 8)
    assert caught_up.until(1) == NOW + 10
    caught_up.applied(1, 9)
    assert caught_up.until(1) == NOW + 60


def test_a_failed_ask_is_made_again_a_little_later() -> None:
    caught_up = CaughtUp()
    caught_up.covers(2, NOW, NOW)
    caught_up.ask_failed(2, NOW)
    assert caught_up.to_ask([2], NOW + ASK_AGAIN_AFTER_FAILURE_MS - 1) == []
    assert caught_up.to_ask([2], NOW + ASK_AGAIN_AFTER_FAILURE_MS) == [2]


class Dispatcher:
    """An engine and its ingest loop over a memory task log, as a dispatcher wires them."""

    def __init__(self, log: MemoryTaskLog, store: MemoryScheduleStore, clock: Clock,
                 name: str = "d1", settings: EngineSettings | None = None) -> None:
        self.released: list[TaskKey] = []
        self.engine = Engine(store, lambda task, release: self.released.append(task.key), name,
                             settings, clock=clock)
        caught_up = CaughtUp()
        self.engine.hears(caught_up=caught_up)
        self.reader = MemoryTaskLogReader(log, TOPIC, partition_eof=True)
        self.ingest = Ingest(self.reader, store, self.engine, MemoryDeadLetters(), lambda: PARTITIONS,
                             clock=clock, caught_up=caught_up)
        self.ingest.assigned(range(PARTITIONS))
        self.engine.assign(range(PARTITIONS))
        self.engine.step()  # takes the leases


def _schedule(log: MemoryTaskLog, key: TaskKey) -> None:
    log.publish_async(key.ordering_id, encode(ScheduleEnvelope(key, "t"))).result(1)


def _cancel(log: MemoryTaskLog, key: TaskKey) -> None:
    log.publish_async(key.ordering_id, encode(CancelEnvelope(key))).result(1)


def _taken_over(*, gated: bool) -> tuple[Dispatcher, MemoryScheduleStore, TaskKey, Clock]:
    """A task due in a second, written by a dispatcher that then died; its cancel acknowledged
    before it was due, not yet read by the dispatcher that took the partition over; three of
    that one's steps without its ingest loop."""
    log, store, clock = MemoryTaskLog(PARTITIONS), MemoryScheduleStore(), Clock(NOW)
    key = TaskKey("a", NOW + 1_000, "u")
    _schedule(log, key)
    first = Dispatcher(log, store, clock)
    first.ingest.poll_once(0)
    first.engine.revoke(range(PARTITIONS))  # it dies; its leases end
    _cancel(log, key)
    clock.ms = NOW + 2_000
    taker = Dispatcher(log, store, clock, "d2")  # loads the task from the store
    if not gated:
        taker.engine.releaser.caught_up = None  # nothing waits
    for _ in range(3):
        clock.ms += 100
        taker.engine.step()
    return taker, store, key, clock


def test_a_task_due_waits_for_its_partition_to_be_read_as_far_as_kafka_holds() -> None:
    taker, store, key, clock = _taken_over(gated=True)
    assert taker.released == []  # the cancel may be in Kafka still
    for _ in range(3):
        taker.ingest.poll_once(0)
        clock.ms += 100
        taker.engine.step()
    assert taker.released == []
    status = store.status(key)
    assert status is not None and status.state is State.CANCELLED


def test_without_the_gate_the_task_is_released_before_its_cancel_is_read() -> None:
    """The broken variant: the same takeover, the engine not waiting for its ingest."""
    taker, _, key, _ = _taken_over(gated=False)
    assert taker.released == [key]


def test_a_task_is_released_once_its_partition_is_caught_up() -> None:
    log, store, clock = MemoryTaskLog(PARTITIONS), MemoryScheduleStore(), Clock(NOW)
    key = TaskKey("a", NOW + 1_000, "u")
    _schedule(log, key)
    dispatcher = Dispatcher(log, store, clock)
    dispatcher.ingest.poll_once(0)
    clock.ms = NOW + 1_000
    dispatcher.engine.step()
    assert dispatcher.released == []  # nothing shown yet for a time this late
    dispatcher.ingest.poll_once(0)  # asks where the partition ends: all of it is applied
    clock.ms += 100
    dispatcher.engine.step()
    assert dispatcher.released == [key]


def test_a_partition_whose_leader_is_away_does_not_hold_the_others_back() -> None:
    """Found on a replicated cluster with a Kafka broker stalled: one leader's silence failed
    the joint request for every partition's end, and every partition's tasks waited."""
    log, store, clock = MemoryTaskLog(PARTITIONS), MemoryScheduleStore(), Clock(NOW)
    ids = [f"o{i}" for i in range(50)]
    here = next(i for i in ids if partition_for(i, PARTITIONS) == 0)
    away = next(i for i in ids if partition_for(i, PARTITIONS) == 1)
    keys = [TaskKey(here, NOW + 1_000, "u"), TaskKey(away, NOW + 1_000, "u")]
    for key in keys:
        _schedule(log, key)
    dispatcher = Dispatcher(log, store, clock)
    answer = dispatcher.reader.end_offsets
    asked: list[list[int]] = []

    def end_offsets(partitions: Collection[int]) -> dict[int, int]:
        asked.append(sorted(partitions))
        if 1 in partitions:
            raise TaskLogUnavailableError("the leader of partition 1 did not answer")
        return answer(partitions)

    dispatcher.reader.end_offsets = end_offsets  # type: ignore[method-assign]
    dispatcher.ingest.poll_once(0)
    clock.ms = NOW + 1_000
    dispatcher.engine.step()  # both wait for their partitions to be caught up
    dispatcher.ingest.poll_once(0)
    clock.ms += 100
    dispatcher.engine.step()
    assert asked == [[0, 1], [0], [1]]
    assert dispatcher.released == [keys[0]]  # partition 1's task waits for its leader


class MarkCounting(MemoryScheduleStore):
    def __init__(self) -> None:
        super().__init__()
        self.marks: list[list[TaskKey]] = []

    def mark_released_and_succeeded(self, released: Any, succeeded: Any, now_ms: int,
                                    runs: Any = None) -> Any:
        if released:
            self.marks.append(sorted(task.key for task, _, _ in released))
        return super().mark_released_and_succeeded(released, succeeded, now_ms, runs)


@pytest.mark.parametrize("answers_at", [NOW + 760, None])
def test_a_take_waits_for_its_later_tasks_while_its_first_can(answers_at: int | None) -> None:
    """A take's tasks marked as the ingest's answers come in would cost a request each step:
    at a steady load, where the ingest is always a little behind the take, that tripled the
    dispatcher's and Cassandra's work a task."""
    log, store, clock = MemoryTaskLog(PARTITIONS), MarkCounting(), Clock(NOW)
    ids = [f"o{i}" for i in range(50)]
    keys = [TaskKey(next(i for i in ids if partition_for(i, PARTITIONS) == p), NOW + 1_000, "u")
            for p in (0, 1)]
    for key in keys:
        _schedule(log, key)
    dispatcher = Dispatcher(log, store, clock, settings=EngineSettings(release_ahead_seconds=0.5))
    answer = dispatcher.reader.end_offsets

    def end_offsets(partitions: Collection[int]) -> dict[int, int]:
        ends = answer(partitions)
        if 1 in ends and not late:  # a record acknowledged, on its way to the ingest
            ends[1] += 1
        return ends

    late: list[TaskKey] = []
    dispatcher.reader.end_offsets = end_offsets  # type: ignore[method-assign]
    dispatcher.ingest.poll_once(0)
    clock.ms = NOW + 700  # the take: both want their partitions caught up
    dispatcher.engine.step()
    dispatcher.ingest.poll_once(0)  # partition 0 is; a record of partition 1 is on its way
    clock.ms = NOW + 750
    dispatcher.engine.step()
    assert store.marks == []  # the first task, due in 250 ms, waits with the take
    if answers_at is not None:
        clock.ms = answers_at
        late.append(TaskKey(keys[1].ordering_id, NOW + 60_000, "later"))
        _schedule(log, late[0])  # the record on its way reaches the ingest
        dispatcher.ingest.poll_once(0)
        clock.ms = NOW + 800
        dispatcher.engine.step()
        assert store.marks == [sorted(keys)]  # both, in one request
    else:  # the first task no longer waits once it is due within the hold
        for ms in range(NOW + 800, NOW + 1_000, 50):
            clock.ms = ms
            dispatcher.ingest.poll_once(0)
            dispatcher.engine.step()
        assert store.marks == [keys[:1]]
