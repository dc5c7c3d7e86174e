"""The Kafka consumer's failures reach the dispatcher as the package's TaskLogErrors."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from celery_scheduler.dispatcher.ingest import Ingest
from celery_scheduler.envelope import ScheduleEnvelope, encode
from celery_scheduler.errors import TaskLogError, TaskLogUnavailableError
from celery_scheduler.keys import TaskKey
from celery_scheduler.store.memory import MemoryScheduleStore
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


def test_ingest_reads_a_batch_again_when_its_commit_fails() -> None:
    tasks = [ScheduleEnvelope(TaskKey("a", at, "u"), "proj.remind", [1]) for at in (10, 20)]
    records = [Message("a", offset, encode(t)) for offset, t in enumerate(tasks)]
    consumer = FailingConsumer(list(records))
    store = MemoryScheduleStore()
    ingest = Ingest(KafkaTaskLogReader(consumer), store, leased_engine(store, range(PARTITIONS)),  # type: ignore[arg-type]
                    DeadLetters(FakeProducer(), "t.deadletter"), lambda: PARTITIONS,  # type: ignore[arg-type]
                    clock=lambda: NOW)

    assert ingest.poll_once() == 0  # the commit failed: the batch does not count as done
    assert consumer.committed == [] and consumer.sought == []  # the seek failed as well

    consumer.failing = False
    consumer.messages = list(records)  # what the next owner, or this one, reads again
    assert ingest.poll_once() == 2
    assert [tp.offset for tp in consumer.committed[0]] == [2]
    assert all(store.status(t.key) is not None for t in tasks)
