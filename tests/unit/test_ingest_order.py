"""A batch that fails half-way never leaves a later task of an ordering id without an earlier one.

Cassandra writes of one round run concurrently, so when Cassandra goes down mid-batch any
subset of them may have landed. The chaos run found a later task of an ordering id stored
(and released) before an earlier one that had to wait for the batch to be applied again.
"""

from __future__ import annotations

from typing import Any

from celery_scheduler.dispatcher.engine import Engine
from celery_scheduler.dispatcher.ingest import DeadLetters, Ingest
from celery_scheduler.envelope import ScheduleEnvelope, encode
from celery_scheduler.errors import StoreUnavailableError
from celery_scheduler.keys import TaskKey
from celery_scheduler.partitioner import partition_for
from celery_scheduler.store.base import Cancel, Put, StoredTask
from celery_scheduler.store.memory import MemoryScheduleStore
from tests.unit.test_ingest_fuzz import NOW, PARTITIONS, FakeProducer


class Message:
    def __init__(self, ordering_id: str, offset: int, value: bytes) -> None:
        self._key, self._offset, self._value = ordering_id.encode(), offset, value

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return partition_for(self._key, PARTITIONS)

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes:
        return self._value

    def headers(self) -> None:
        return None


class Consumer:
    def __init__(self, messages: list[Message]) -> None:
        self.messages = messages
        self.committed: list[Any] = []
        self.sought: list[Any] = []

    def consume(self, count: int, timeout: float) -> list[Message]:
        messages, self.messages = self.messages, []
        return messages

    def commit(self, offsets: Any, asynchronous: bool) -> None:
        self.committed.append(offsets)

    def seek(self, partition: Any) -> None:
        self.sought.append(partition)


class HalfDownStore(MemoryScheduleStore):
    """Writes every operation of a round except those of *failing* keys, then fails."""

    def __init__(self, failing: set[TaskKey]) -> None:
        super().__init__()
        self.failing = failing

    def apply(self, operations: list[Put | Cancel], now_ms: int) -> list[StoredTask | bool | None]:
        results = [super(HalfDownStore, self).apply([op], now_ms)[0]
                   for op in operations if op.key not in self.failing]
        if len(results) < len(operations):
            raise StoreUnavailableError("Cassandra went down during the round")
        return results


def test_a_failed_round_stops_the_later_tasks_of_its_ordering_ids() -> None:
    tasks = [ScheduleEnvelope(TaskKey(o, at, "u"), "proj.remind", [1])
             for o, at in (("a", 10), ("a", 20), ("b", 10), ("a", 30))]
    store = HalfDownStore(failing={tasks[0].key})
    consumer = Consumer([Message(t.key.ordering_id, offset, encode(t)) for offset, t in enumerate(tasks)])
    engine = Engine(store, lambda task, release: None, "test", clock=lambda: NOW)
    ingest = Ingest(consumer, store, engine, DeadLetters(FakeProducer(), "t.deadletter"),  # type: ignore[arg-type]
                    lambda: PARTITIONS, clock=lambda: NOW)

    assert ingest.poll_once() == 0  # failed: nothing committed, read again from the start

    assert consumer.committed == []
    assert {tp.offset for tp in consumer.sought} <= {0, 2}
    stored = {t.key for t in tasks if store.status(t.key) is not None}
    assert tasks[1].key not in stored and tasks[3].key not in stored  # nothing after a's first
    assert tasks[2].key in stored  # other ordering ids are not held back

    store.failing.clear()
    consumer.messages = [Message(t.key.ordering_id, offset, encode(t)) for offset, t in enumerate(tasks)]
    assert ingest.poll_once() == 4
    assert all(store.status(t.key) is not None for t in tasks)
