"""A Kafka producer that stops working is replaced, and what it held is reported, not lost silently.

A long chaos run left the client's producer, after repeated Kafka restarts, accepting records
and never reporting on them again: every later schedule call of that process failed. The
task log now replaces a producer that holds a record long past its delivery timeout, or that
reported a fatal error.

The task log's poll thread is not started here: each test runs its check itself, at the
time it names, so none waits on a timer.
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

    # Kafka's signature: the task log passes value, key, partition and callback by position
    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                partition: int = -1, on_delivery: Any = None, timestamp: int = 0,
                headers: Any = None) -> None:
        self.produced.append(value or b"")

    def poll(self, timeout: float = 0) -> int:
        return 0

    def purge(self) -> None:
        self.purged = True

    def flush(self, timeout: float = 0) -> int:
        return len(self.produced)


@pytest.fixture
def log(monkeypatch: pytest.MonkeyPatch) -> Iterator[KafkaTaskLog]:
    monkeypatch.setattr(kafka, "STUCK_GRACE", 1.0)
    monkeypatch.setattr(KafkaTaskLog, "_poll_forever", lambda self: None)  # the tests check
    log = KafkaTaskLog("127.0.0.1:1", "topic", timeout=1.0)  # nothing listens: never delivers
    log._partitions = 6  # no metadata request
    yield log
    log._closed.set()


def _later(log: KafkaTaskLog) -> float:
    """A monotonic time past the point where a record held since now counts as stuck."""
    return time.monotonic() + log._stuck_after + 1


def test_a_producer_that_never_reports_is_replaced(log: KafkaTaskLog) -> None:
    silent = SilentProducer()
    log._producer = silent
    future = log.publish_async("o1", b"record")
    log._check(time.monotonic())
    assert log.replaced == 0 and not future.done()  # not overdue yet
    log._check(_later(log))
    with pytest.raises(TaskLogUnavailableError, match="producer was replaced"):
        future.result(timeout=0)
    assert log.replaced == 1 and silent.purged
    assert log._producer is not silent

    later = log.publish_async("o1", b"next")
    assert silent.produced == [b"record"]  # the next record went to the new producer
    assert list(log._pending) == [later] and not later.done()


def test_a_fatal_error_replaces_the_producer(log: KafkaTaskLog) -> None:
    first = log._producer
    log._on_error(KafkaError(KafkaError._FATAL, "fenced", fatal=True))
    log._check(time.monotonic())
    assert log.replaced == 1 and log._producer is not first


def test_an_ordinary_error_does_not(log: KafkaTaskLog) -> None:
    first = log._producer
    log._on_error(KafkaError(KafkaError._TRANSPORT, "broker down"))
    log._check(time.monotonic())
    assert log.replaced == 0 and log._producer is first


def test_a_producer_whose_records_keep_failing_is_replaced(log: KafkaTaskLog) -> None:
    first = log._producer
    future = log.publish_async("o1", b"record")  # nothing listens: it times out after 1 s
    deadline = time.monotonic() + 10
    while not future.done() and time.monotonic() < deadline:
        first.poll(0.1)  # serves the delivery report, as the poll thread would
    # the error says the record may have been written after all, and what to do about it
    with pytest.raises(TaskLogUnavailableError,
                       match=r"did not acknowledge.*the task may still run.*the same task key runs once"):
        future.result(timeout=0)
    log._check(time.monotonic())
    assert log.replaced == 0  # one failure is not yet a producer that keeps failing
    log._check(_later(log))
    assert log.replaced == 1 and log._producer is not first


class ReportingProducer(SilentProducer):
    """Keeps each record's delivery report, to serve it when the test says."""

    def __init__(self) -> None:
        super().__init__()
        self.reports: list[Any] = []

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                partition: int = -1, on_delivery: Any = None, timestamp: int = 0,
                headers: Any = None) -> None:
        super().produce(topic, value, key, partition, on_delivery)
        self.reports.append(on_delivery)


class Delivered:
    def partition(self) -> int:
        return 4

    def offset(self) -> int:
        return 99


def test_a_report_that_comes_after_the_replacement_changes_nothing(log: KafkaTaskLog) -> None:
    # Reports do not take the log's lock: each record is either its report's or the
    # replacement's, whichever takes it first, and its ack is settled once.
    old = ReportingProducer()
    log._producer = old
    first, second = log.publish_async("o1", b"a"), log.publish_async("o2", b"b")
    old.reports[0](None, Delivered())  # served before the replacement
    assert first.result(timeout=0) == (4, 99)
    log._check(_later(log))
    assert log.replaced == 1 and second.done()
    old.reports[1](None, Delivered())  # the old producer's late report for a failed record
    with pytest.raises(TaskLogUnavailableError, match="producer was replaced"):
        second.result(timeout=0)
    assert log._pending == {}


def test_a_record_the_producer_refuses_is_not_left_waiting(log: KafkaTaskLog) -> None:
    class Refusing(SilentProducer):
        def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                    partition: int = -1, on_delivery: Any = None, timestamp: int = 0,
                    headers: Any = None) -> None:
            raise kafka.KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too large"))

    log._producer = Refusing()
    with pytest.raises(Exception, match="too large"):
        log.publish_async("o1", b"x")
    assert log._pending == {}  # listed before it was produced, and taken off again
