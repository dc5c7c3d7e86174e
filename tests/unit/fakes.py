"""The fakes the unit tests share: Kafka's messages, consumer and producer, and an engine.

Clocks come from the package (:class:`celery_scheduler.clock.FakeClock`), as the testing
helper's do.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from celery_scheduler.dispatcher.engine import Engine
from celery_scheduler.partitioner import partition_for
from celery_scheduler.store.memory import MemoryScheduleStore

PARTITIONS = 6  # of the scheduler topic the fakes stand for
NOW = 1_893_456_000_000  # 2030-01-01T00:00:00Z, the fake clocks' start


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
        self.paused: set[int] = set()

    def consume(self, count: int, timeout: float) -> list[Message]:
        messages, self.messages = self.messages, []
        return messages

    def commit(self, offsets: Any, asynchronous: bool) -> None:
        self.committed.append(offsets)

    def seek(self, partition: Any) -> None:
        self.sought.append(partition)

    def pause(self, partitions: list[Any]) -> None:
        self.paused |= {tp.partition for tp in partitions}

    def resume(self, partitions: list[Any]) -> None:
        self.paused -= {tp.partition for tp in partitions}


class FakeProducer:
    def __init__(self) -> None:
        self.records: list[tuple[Any, Any, Any]] = []

    def produce(self, topic: str, key: Any, value: Any, headers: Any, on_delivery: Any) -> None:
        self.records.append((key, value, dict(headers)["reason"]))

    def flush(self, timeout: float) -> int:
        return 0


def leased_engine(store: MemoryScheduleStore, partitions: Iterable[int]) -> Engine:
    """An engine (not running: stepped here) that holds the leases of *partitions*."""
    engine = Engine(store, lambda task, release: None, "test", clock=lambda: NOW)
    engine.assign(partitions)
    engine.step()
    return engine
