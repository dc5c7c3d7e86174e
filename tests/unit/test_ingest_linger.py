"""At a light load the ingest loop gathers what a second brings into one batch, unless a record
is due soon: then it writes at once, as without the linger."""

from __future__ import annotations

import time
from typing import Any

from celery_scheduler.dispatcher.ingest import URGENT_SECONDS, DeadLetters, Ingest
from celery_scheduler.envelope import CancelEnvelope, ScheduleEnvelope, encode
from celery_scheduler.errors import TaskLogError
from celery_scheduler.keys import TaskKey
from celery_scheduler.store.base import Operation, StoredTask
from celery_scheduler.store.memory import MemoryScheduleStore
from tests.unit.fakes import NOW, PARTITIONS, Consumer, FakeProducer, Message, leased_engine

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
    return Ingest(consumer, store, leased_engine(store, range(PARTITIONS)),  # type: ignore[arg-type]
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
