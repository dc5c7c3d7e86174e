"""A Kafka producer that stops working is replaced, and what it held is reported, not lost silently.

A long chaos run left the client's producer, after repeated Kafka restarts, accepting records
and never reporting on them again: every later schedule call of that process failed. The
task log now replaces a producer that holds a record long past its delivery timeout, or that
reported a fatal error.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError

from celery_scheduler.errors import TaskLogUnavailableError
from celery_scheduler.tasklog import kafka
from celery_scheduler.tasklog.kafka import KafkaTaskLog


class SilentProducer:
    """Takes records and never reports on them (what the stuck producer did)."""

    def __init__(self) -> None:
        self.produced: list[bytes] = []
        self.purged = False

    def produce(self, topic: str, key: bytes, value: bytes, headers: Any, on_delivery: Any) -> None:
        self.produced.append(value)

    def poll(self, timeout: float = 0) -> int:
        time.sleep(min(timeout, 0.05))
        return 0

    def purge(self) -> None:
        self.purged = True

    def flush(self, timeout: float = 0) -> int:
        return len(self.produced)


@pytest.fixture
def log(monkeypatch: pytest.MonkeyPatch) -> Iterator[KafkaTaskLog]:
    monkeypatch.setattr(kafka, "STUCK_GRACE", 1.0)
    log = KafkaTaskLog("127.0.0.1:1", "topic", timeout=1.0)  # nothing listens: never delivers
    log._partitions = 6  # no metadata request
    yield log
    log._closed.set()


def test_a_producer_that_never_reports_is_replaced(log: KafkaTaskLog) -> None:
    silent = SilentProducer()
    log._producer = silent
    future = log.publish_async("o1", b"record")
    with pytest.raises(TaskLogUnavailableError, match="producer was replaced"):
        future.result(timeout=10)
    assert log.replaced == 1 and silent.purged
    assert log._producer is not silent

    later = log.publish_async("o1", b"next")
    assert silent.produced == [b"record"]  # the next record went to the new producer
    assert [future for _, future, _ in log._pending.values()] == [later] and not later.done()


def test_a_fatal_error_replaces_the_producer(log: KafkaTaskLog) -> None:
    first = log._producer
    log._on_error(KafkaError(KafkaError._FATAL, "fenced", fatal=True))
    deadline = time.monotonic() + 5
    while log.replaced == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert log.replaced == 1 and log._producer is not first


def test_an_ordinary_error_does_not(log: KafkaTaskLog) -> None:
    first = log._producer
    log._on_error(KafkaError(KafkaError._TRANSPORT, "broker down"))
    time.sleep(1.5)
    assert log.replaced == 0 and log._producer is first


def test_a_producer_whose_records_keep_failing_is_replaced(log: KafkaTaskLog) -> None:
    first = log._producer
    future = log.publish_async("o1", b"record")  # nothing listens: it times out after 1 s
    # the error says the record may have been written after all, and what to do about it
    with pytest.raises(TaskLogUnavailableError,
                       match=r"did not acknowledge.*the task may still run.*the same task key runs once"):
        future.result(timeout=10)
    deadline = time.monotonic() + 10
    while log.replaced == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert log.replaced == 1 and log._producer is not first
