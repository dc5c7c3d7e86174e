"""At a light load the ingest loop gathers what a second brings into one batch, unless a record
is due soon: then it writes at once, as without the linger."""

from __future__ import annotations

import time
from typing import Any

import pytest

from celery_scheduler.dispatcher.caught_up import CaughtUp
from celery_scheduler.dispatcher.ingest import URGENT_SECONDS, Ingest, cannot_hold_back
from celery_scheduler.envelope import (
    CancelEnvelope,
    RescheduleEnvelope,
    RetryEnvelope,
    ScheduleEnvelope,
    encode,
)
from celery_scheduler.errors import TaskLogError
from celery_scheduler.keys import TaskKey
from celery_scheduler.partitioner import partition_for
from celery_scheduler.store.base import Operation, StoredTask
from celery_scheduler.store.memory import MemoryScheduleStore
from celery_scheduler.tasklog.dead_letters import DeadLetters
from tests.unit.fakes import NOW, PARTITIONS, Consumer, FakeProducer, Message, leased_engine, reader

LINGER = 0.3
FAILS: list[Message] = []  # a chunk that makes the consume call raise


class CountingStore(MemoryScheduleStore):
    def __init__(self) -> None:
        super().__init__()
        self.applied: list[int] = []

    def apply(self, operations: list[Operation], now_ms: int) -> list[StoredTask | bool | None]:
        self.applied.append(len(operations))
        return super().apply(operations, now_ms)


class Trickle(Consumer):
    """Hands out one chunk of messages a call; with none left, waits *timeout* as Kafka does."""

    def __init__(self, chunks: list[list[Message]]) -> None:
        super().__init__([])
        self.chunks = chunks
        self.calls = 0

    def consume(self, count: int, timeout: float) -> list[Message]:
        self.calls += 1
        if self.chunks and self.chunks[0] is FAILS:
            self.chunks.pop(0)
            raise TaskLogError("the broker went away")
        if not self.chunks:
            time.sleep(min(timeout, 0.05))
            return []
        return self.chunks.pop(0)[:count]


def _message(offset: int, envelope: Any) -> Message:
    return Message(envelope.key.ordering_id, offset, encode(envelope))


def _task(n: int, due_in_seconds: float) -> ScheduleEnvelope:
    return ScheduleEnvelope(TaskKey(f"o{n}", NOW + int(due_in_seconds * 1000), "u"), "proj.remind", [n])


def _ingest(consumer: Consumer, store: MemoryScheduleStore, batch_size: int = 1000) -> Ingest:
    return Ingest(reader(consumer), store, leased_engine(store, range(PARTITIONS)),  # type: ignore[arg-type]
                  DeadLetters(FakeProducer(), "t.deadletter"), lambda: PARTITIONS,
                  batch_size=batch_size, linger_seconds=LINGER, clock=lambda: NOW)


def test_records_due_later_are_gathered_into_one_batch() -> None:
    tasks = [_task(n, 60) for n in range(6)]
    store = CountingStore()
    consumer = Trickle([[_message(n, t)] for n, t in enumerate(tasks)])
    started = time.monotonic()

    assert _ingest(consumer, store).poll_once() == 6

    assert store.applied == [6]  # one batch, one status read per (partition, slot)
    assert all(store.status(t.key) is not None for t in tasks)
    assert time.monotonic() - started < LINGER + 0.2  # and no longer than the linger


def test_a_record_due_soon_is_written_without_waiting() -> None:
    soon = _task(1, URGENT_SECONDS / 2)
    store = CountingStore()
    consumer = Trickle([[_message(0, _task(0, 60)), _message(1, soon)], [_message(2, _task(2, 60))]])

    assert _ingest(consumer, store).poll_once() == 2

    assert consumer.calls == 1 and store.applied == [2]
    assert store.status(soon.key) is not None


def test_a_cancel_is_written_without_waiting() -> None:
    task = _task(0, 60)
    store = CountingStore()
    consumer = Trickle([[_message(0, task)], [_message(1, CancelEnvelope(task.key))],
                        [_message(2, _task(2, 60))]])

    assert _ingest(consumer, store).poll_once() == 2  # the task, then its cancel, not the third

    assert consumer.calls == 2
    assert store.status(task.key) is not None and store.status(task.key).state.value == "cancelled"


def test_a_batch_stops_growing_at_the_batch_size() -> None:
    store = CountingStore()
    consumer = Trickle([[_message(n, _task(n, 60))] for n in range(10)])

    assert _ingest(consumer, store, batch_size=4).poll_once() == 4

    assert consumer.calls == 4 and store.applied == [4]


def test_without_a_linger_each_poll_writes_what_it_read() -> None:
    store = CountingStore()
    consumer = Trickle([[_message(n, _task(n, 60))] for n in range(3)])
    ingest = _ingest(consumer, store)
    ingest.linger_seconds = 0

    assert [ingest.poll_once() for _ in range(3)] == [1, 1, 1]
    assert store.applied == [1, 1, 1]


def test_what_was_read_before_a_failed_poll_is_written() -> None:
    """The consumer's position is past those records: dropping them would lose them."""
    tasks = [_task(n, 60) for n in range(3)]
    store = CountingStore()
    consumer = Trickle([[_message(0, tasks[0]), _message(1, tasks[1])], FAILS, [_message(2, tasks[2])]])

    assert _ingest(consumer, store).poll_once() == 2

    assert store.applied == [2]
    assert [tp.offset for batch in consumer.committed for tp in batch]  # and committed
    assert store.status(tasks[0].key) is not None and store.status(tasks[1].key) is not None


class Ends(Trickle):
    """A trickle that says where each partition ends (*ends*), and whether the engine's wait
    for *watched* was answered at each consume call."""

    def __init__(self, chunks: list[list[Message]], ends: dict[int, int], caught_up: CaughtUp,
                 watched: int) -> None:
        super().__init__(chunks)
        self.ends, self.caught_up, self.watched = ends, caught_up, watched
        self.answered: list[bool] = []

    def consume(self, count: int, timeout: float) -> list[Message]:
        self.answered.append(self.caught_up.covers(self.watched, NOW, NOW))
        return super().consume(count, timeout)


def _in_partition(partition: int, count: int) -> list[str]:
    ids = (f"o{n}" for n in range(10_000))
    return [i for i in ids if partition_for(i, PARTITIONS) == partition][:count]


def _waiting_ingest(chunks: list[list[Message]], ends: dict[int, int], store: CountingStore,
                    watched: int) -> tuple[Ingest, Ends]:
    caught_up = CaughtUp()
    consumer = Ends(chunks, ends, caught_up, watched)
    ingest = _ingest(consumer, store)
    ingest.caught_up = caught_up
    ingest.assigned(range(PARTITIONS))
    assert not caught_up.covers(watched, NOW, NOW)  # the engine waits for the partition
    return ingest, consumer


def test_a_waiting_engine_hears_of_plain_calls_due_later_without_ending_the_linger() -> None:
    """At a steady load the engine always waits for some partition: a batch cut short at each
    wait would write a few records at a time."""
    ids = _in_partition(1, 3)
    tasks = [ScheduleEnvelope(TaskKey(i, NOW + 60_000, "u"), "proj.remind") for i in ids]
    store = CountingStore()
    ingest, consumer = _waiting_ingest([[_message(n, t)] for n, t in enumerate(tasks)], {1: 3},
                                       store, watched=1)

    assert ingest.poll_once() == 3

    assert store.applied == [3]  # one write still
    assert consumer.answered[:3] == [False, False, False] and True in consumer.answered[3:]


@pytest.mark.parametrize("held", [
    pytest.param(lambda key: ScheduleEnvelope(key, "proj.remind", options={"task_id": "t-1"}),
                 id="a task named by its task id, which may move another key"),
    pytest.param(lambda key: RescheduleEnvelope(TaskKey(key.ordering_id, NOW, key.uniqueness_key),
                                                ScheduleEnvelope(key, "proj.remind")),
                 id="a move"),
])
def test_a_waiting_engine_has_a_record_that_may_hold_a_release_back_written_at_once(
        held: Any) -> None:
    first, second = _in_partition(1, 2)
    plain = ScheduleEnvelope(TaskKey(first, NOW + 60_000, "u"), "proj.remind")
    store = CountingStore()
    ingest, consumer = _waiting_ingest(
        [[_message(0, plain)], [_message(1, held(TaskKey(second, NOW + 60_000, "n")))],
         [_message(2, _task(2, 60))]], {1: 2}, store, watched=1)

    assert ingest.poll_once() == 2  # the third record is left for the next batch

    assert store.applied[-1] >= 1 and consumer.answered == [False, False]
    assert ingest.caught_up is not None and ingest.caught_up.covers(1, NOW, NOW)


@pytest.mark.parametrize(("envelope", "expected"), [
    (ScheduleEnvelope(TaskKey("o", NOW + 1_001, "u"), "proj.remind"), True),
    (ScheduleEnvelope(TaskKey("o", NOW + 1_000, "u"), "proj.remind"), False),  # due by then
    (ScheduleEnvelope(TaskKey("o", NOW + 5_000, "u"), "proj.remind", options={"task_id": "x"}), False),
    (CancelEnvelope(TaskKey("o", NOW + 5_000, "u")), False),
    (RetryEnvelope(TaskKey("o", NOW + 5_000, "u")), False),
    (None, False),  # not decoded
])
def test_only_plain_calls_due_later_cannot_hold_a_release_back(envelope: Any, expected: bool) -> None:
    assert cannot_hold_back(envelope, NOW + 1_000) is expected
