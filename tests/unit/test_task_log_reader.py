"""The Kafka consumer reaches the dispatcher through the reader port: its records and events
in the package's types, and its failures as the package's TaskLogErrors."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from celery_scheduler.dispatcher.ingest import Ingest
from celery_scheduler.envelope import ScheduleEnvelope, encode
from celery_scheduler.errors import TaskLogError, TaskLogUnavailableError
from celery_scheduler.keys import TaskKey
from celery_scheduler.signing import HEADER as SIGNATURE_HEADER
from celery_scheduler.store.memory import MemoryScheduleStore
from celery_scheduler.tasklog.base import PartitionEnd, Record
from celery_scheduler.tasklog.dead_letters import DeadLetters
from celery_scheduler.tasklog.reader import KafkaTaskLogReader, kafka_errors
from tests.unit.fakes import NOW, PARTITIONS, Consumer, FakeProducer, Message, leased_engine


def _raise(code: int, text: str) -> None:
    raise KafkaException(KafkaError(code, text))


def test_an_unreachable_broker_is_unavailable_naming_what_failed() -> None:
    with (pytest.raises(TaskLogUnavailableError, match="Kafka could not commit offsets: brokers down"),
          kafka_errors("commit offsets")):
        _raise(KafkaError._ALL_BROKERS_DOWN, "brokers down")


def test_another_kafka_error_is_a_task_log_error_but_not_an_outage() -> None:
    with (pytest.raises(TaskLogError, match="Kafka could not seek partition 3") as raised,
          kafka_errors("seek partition 3")):
        _raise(KafkaError._STATE, "Erroneous state")
    assert not isinstance(raised.value, TaskLogUnavailableError)
    assert isinstance(raised.value.__cause__, KafkaException)  # the driver's error is kept


def test_a_full_producer_queue_is_unavailable() -> None:
    with (pytest.raises(TaskLogUnavailableError, match="queue is full"),
          kafka_errors("dead-letter record t/0@1")):
        raise BufferError("Local: Queue full")


class FailingConsumer(Consumer):
    """The ingest tests' consumer, whose commits and seeks fail as a restarting broker's do."""

    def __init__(self, messages: list[Message]) -> None:
        super().__init__(messages)
        self.failing = True

    def commit(self, offsets: Any, asynchronous: bool) -> None:
        if self.failing:
            _raise(KafkaError._TRANSPORT, "Broker transport failure")
        super().commit(offsets, asynchronous)

    def seek(self, partition: Any) -> None:
        if self.failing:
            _raise(KafkaError._STATE, "partition not assigned")
        super().seek(partition)


def test_a_commit_that_fails_leaves_the_batch_written_and_the_next_commit_covers_it(
        caplog: pytest.LogCaptureFixture) -> None:
    """A commit lost only means records read again after a restart: the batch was written,
    and what it carried to the next batch (carrying.py) stays carried and held."""
    tasks = [ScheduleEnvelope(TaskKey("a", at, "u"), "proj.remind", [1]) for at in (10, 20, 30)]
    records = [Message("a", offset, encode(t)) for offset, t in enumerate(tasks)]
    consumer = FailingConsumer(list(records[:2]))
    store = MemoryScheduleStore()
    ingest = Ingest(KafkaTaskLogReader("t", lambda: consumer), store, leased_engine(store, range(PARTITIONS)),  # type: ignore[arg-type]
                    DeadLetters(FakeProducer(), "t.deadletter"), lambda: PARTITIONS,  # type: ignore[arg-type]
                    clock=lambda: NOW)

    with caplog.at_level(logging.WARNING, logger="celery_scheduler.dispatcher.ingest"):
        assert ingest.poll_once() == 2  # written, though the commit failed
    assert consumer.committed == [] and consumer.sought == []
    assert any("could not commit offsets" in r.getMessage() for r in caplog.records)
    assert all(store.status(t.key) is not None for t in tasks[:2])

    consumer.failing = False
    consumer.messages = [records[2]]
    assert ingest.poll_once() == 1
    assert [tp.offset for tp in consumer.committed[0]] == [3]  # past both batches
    assert store.status(tasks[2].key) is not None


class Read(Consumer):
    """The fakes' consumer, handing out driver messages and events as given."""

    def consume(self, count: int, timeout: float) -> list[Any]:
        return list(self.messages)


class Event:
    """A driver message that carries an error (an end of partition, say)."""

    def __init__(self, partition: int, offset: int, code: int) -> None:
        self._partition, self._offset, self._code = partition, offset, code

    def error(self) -> KafkaError:
        return KafkaError(self._code)

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset


class Signed(Message):
    def headers(self) -> list[tuple[str, bytes]]:  # type: ignore[override]
        return [("other", b"x"), (SIGNATURE_HEADER, b"sig")]


def test_the_reader_gives_records_and_partition_ends_in_the_packages_types(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="celery_scheduler.tasklog.reader")
    message = Signed("a", 7, b"{}")
    reader = KafkaTaskLogReader("t", lambda: Read([message, Event(2, 9, KafkaError._PARTITION_EOF),
                                                  Event(1, 0, KafkaError._STATE)]))
    read = reader.consume(10, 0)
    assert read == [Record("t", message.partition(), 7, b"a", b"{}", b"sig"), PartitionEnd(2, 9)]
    assert "Kafka reported" in caplog.text  # another error is said, not handed on


def test_the_reader_speaks_partition_numbers_to_the_driver_in_its_topic() -> None:
    consumer = Consumer([])
    reader = KafkaTaskLogReader("sched", lambda: consumer)
    reader.seek(3, 40)
    reader.pause([1, 2])
    reader.commit({4: 11})
    assert [(tp.topic, tp.partition, tp.offset) for tp in consumer.sought] == [("sched", 3, 40)]
    assert consumer.paused == {1, 2}
    assert [(tp.topic, tp.partition, tp.offset) for tp in consumer.committed[0]] == [("sched", 4, 11)]
    consumer.ends = {5: 8}
    assert reader.end_offsets([5, 6]) == {5: 8, 6: 0}


class Subscribing(Consumer):
    def __init__(self) -> None:
        super().__init__([])
        self.callbacks: dict[str, Any] = {}
        self.closed = False

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        self.callbacks = callbacks

    def close(self) -> None:
        self.closed = True


def test_a_rejoined_reader_hears_only_its_new_consumers_assignments() -> None:
    made: list[Subscribing] = []

    def make() -> Subscribing:
        made.append(Subscribing())
        return made[-1]

    heard: list[tuple[str, list[int]]] = []
    reader = KafkaTaskLogReader("t", make)
    reader.subscribe(lambda ps: heard.append(("assigned", ps)), lambda ps: heard.append(("revoked", ps)),
                     lambda ps: heard.append(("lost", ps)))
    first = made[0]
    first.callbacks["on_assign"](first, [TopicPartition("t", 1), TopicPartition("t", 4)])
    reader.rejoin()
    assert len(made) == 2 and reader.consumer is made[1]
    first.callbacks["on_revoke"](first, [TopicPartition("t", 1)])  # closing aside: nobody hears
    made[1].callbacks["on_lost"](made[1], [TopicPartition("t", 2)])
    assert heard == [("assigned", [1, 4]), ("lost", [2])]


class Waiting(Consumer):
    """Records the timeout of each consume."""

    def __init__(self) -> None:
        super().__init__([])
        self.timeouts: list[float] = []

    def consume(self, count: int, timeout: float) -> list[Message]:
        self.timeouts.append(timeout)
        return super().consume(count, timeout)


def test_a_negative_timeout_reads_what_is_there_and_never_waits_forever() -> None:
    """librdkafka takes any negative timeout, however small, as "wait forever"."""
    consumer = Waiting()
    reader = KafkaTaskLogReader("t", lambda: consumer)
    reader.consume(10, -1e-6)
    reader.consume(10, 0.25)
    assert consumer.timeouts == [0.0, 0.25]
