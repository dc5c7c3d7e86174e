"""The fakes the unit tests share: Kafka's messages, consumer and producer, a store with
outages, and an engine.

Clocks of epoch milliseconds come from the package (:class:`celery_scheduler.clock.FakeClock`),
as the testing helper's do; :class:`SecondsClock` stands in for ``time.monotonic``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar, NamedTuple

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from celery_scheduler.dispatcher.engine import Engine
from celery_scheduler.errors import StoreUnavailableError
from celery_scheduler.partitioner import partition_for
from celery_scheduler.store.base import ScheduleStore
from celery_scheduler.store.memory import MemoryScheduleStore
from celery_scheduler.tasklog.reader import KafkaTaskLogReader

PARTITIONS = 6  # of the scheduler topic the fakes stand for
NOW = 1_893_456_000_000  # 2030-01-01T00:00:00Z, the fake clocks' start


class SecondsClock:
    """Seconds that move only when a test sets ``now``: for code given a ``time.monotonic``."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


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
        self.ends: dict[int, int] = {}

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

    def offsets_for_times(self, asked: list[Any], timeout: float) -> list[Any]:
        """Where each partition ends: ``ends`` (0 for one it does not name)."""
        return [TopicPartition(tp.topic, tp.partition, self.ends.get(tp.partition, 0)) for tp in asked]


def reader(consumer: Consumer) -> KafkaTaskLogReader:
    """*consumer* seen through the task log's reader port, as the dispatcher sees Kafka's."""
    return KafkaTaskLogReader("t", lambda: consumer)


class Record(NamedTuple):
    """One record given to a :class:`FakeProducer`."""

    topic: str
    key: Any
    value: Any
    headers: Any  # as given: a list of (name, bytes), a dict, or None
    on_delivery: Callable[[KafkaError | None, Any], None] | None

    def header(self, name: str) -> bytes | None:
        return dict(self.headers or {}).get(name)


class FakeProducer:
    """confluent-kafka's ``Producer`` in memory, for every client of the package that produces.

    Each record joins ``produced`` (all of them, in order) and waits in ``held`` for its
    delivery report, which carries ``error`` (None: delivered). The report comes at the next
    ``poll`` or ``flush``, or, with *hold*, only when the test calls :meth:`deliver` or
    :meth:`fail` (a broker that takes its time). As the real client: ``purge`` reports what
    it held as purged at the next poll, and with ``delivery.report.only.error`` in *config*
    a delivered record is not reported. ``room``: records it takes before ``BufferError``
    (a full queue); ``fatal_once``: the next produce raises a fatal error; ``silent``: polls
    report nothing (a client waiting for a leader it does not know).
    """

    made: ClassVar[list[FakeProducer]] = []  # every one constructed, newest last

    def __init__(self, config: dict[str, Any] | None = None, *, error: KafkaError | None = None,
                 hold: bool = False) -> None:
        self.config = dict(config or {})
        self.error = error
        self.hold = hold
        self.silent = False
        self.room = 10**9
        self.fatal_once = False
        self.purged = False
        self.produced: list[Record] = []
        self.held: list[Record] = []
        self._purging: list[Record] = []
        FakeProducer.made.append(self)

    def produce(self, topic: str, value: Any = None, key: Any = None, partition: int = -1,
                on_delivery: Callable[[KafkaError | None, Any], None] | None = None,
                timestamp: int = 0, headers: Any = None) -> None:
        if self.fatal_once:
            self.fatal_once = False
            raise KafkaException(KafkaError(KafkaError._FATAL, "fenced", fatal=True))
        if self.room <= 0:
            raise BufferError("queue full")
        self.room -= 1
        record = Record(topic, key, value, headers, on_delivery)
        self.produced.append(record)
        self.held.append(record)

    def values(self) -> list[Any]:
        """The value of every record produced, in order."""
        return [record.value for record in self.produced]

    def _report(self, records: list[Record], error: KafkaError | None) -> None:
        for record in records:
            if record.on_delivery is not None and (
                    error is not None or not self.config.get("delivery.report.only.error")):
                key = record.key.decode() if isinstance(record.key, bytes) else str(record.key)
                record.on_delivery(error, Message(key, 0, record.value))

    def deliver(self, count: int | None = None) -> None:
        """The broker acknowledges the first *count* records held (all by default)."""
        done, self.held = self.held[:count], self.held[len(self.held[:count]):]
        self.room += len(done)
        self._report(done, None)

    def fail(self, key: Any, code: int = KafkaError._MSG_TIMED_OUT) -> None:
        """Every record of *key* held fails with *code*."""
        failed = [record for record in self.held if record.key == key]
        self.held = [record for record in self.held if record.key != key]
        self._report(failed, KafkaError(code, "timed out"))

    def poll(self, timeout: float = 0) -> int:
        purging, self._purging = self._purging, []
        self._report(purging, KafkaError(KafkaError._PURGE_QUEUE, "purged"))
        if self.hold or self.silent:
            return len(purging)
        reports, self.held = self.held, []
        self.room += len(reports)
        self._report(reports, self.error)
        return len(purging) + len(reports)

    def flush(self, timeout: float = 0) -> int:
        self.poll()
        return len(self.held) if self.hold else 0

    def purge(self) -> None:
        self.purged, self.silent = True, False
        self._purging, self.held = self._purging + self.held, []

    def __len__(self) -> int:
        return len(self.held) + len(self._purging)


class OutageStore(MemoryScheduleStore):
    """The memory store, whose methods named in *failing* raise ``StoreUnavailableError``
    (writing nothing) while ``down`` is set: a Cassandra outage as the dispatcher meets it."""

    def __init__(self, *failing: str, bucket_seconds: int = 60) -> None:
        super().__init__(bucket_seconds)
        self.down = False
        for name in failing:
            if not callable(getattr(ScheduleStore, name, None)):
                raise ValueError(f"{name!r} is not a method of the schedule store")
            setattr(self, name, self._unless_down(name, getattr(self, name)))

    def _unless_down(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if self.down:
                raise StoreUnavailableError(f"Cassandra could not answer {name}(): down")
            return method(*args, **kwargs)
        return call


def leased_engine(store: MemoryScheduleStore, partitions: Iterable[int]) -> Engine:
    """An engine (not running: stepped here) that holds the leases of *partitions*."""
    engine = Engine(store, lambda task, release: None, "test", clock=lambda: NOW)
    engine.assign(partitions)
    engine.step()
    return engine
