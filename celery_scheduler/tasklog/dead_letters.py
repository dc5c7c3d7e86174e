"""Where records read from the scheduler topic that cannot be scheduled go.

A :class:`~celery_scheduler.tasklog.base.Record` that cannot be decoded, or breaks the rules
a dispatcher relies on, is copied to the dead-letter topic with the reason
(:class:`DeadLetters`; :class:`MemoryDeadLetters` keeps them in memory for the testing
helper and unit tests), and the partition moves on.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from confluent_kafka import KafkaError, Producer

from celery_scheduler.errors import TaskLogError
from celery_scheduler.metrics import Metrics
from celery_scheduler.tasklog.base import Record
from celery_scheduler.tasklog.reader import kafka_errors

__all__ = ["DeadLetterSink", "DeadLetters", "MemoryDeadLetters", "Record"]

# its lines are the ingest loop's, as they were before this module was split from it
logger = logging.getLogger("celery_scheduler.dispatcher.ingest")


class DeadLetterSink(Protocol):
    """Where records that cannot be scheduled go, with the reason."""

    def send(self, record: Record, reason: str) -> None: ...

    def flush(self, timeout: float = 30.0) -> None: ...


class MemoryDeadLetters:
    """Keeps what would be dead-lettered, for the testing helper and unit tests."""

    def __init__(self) -> None:
        self.sent: list[tuple[Record, str]] = []

    def send(self, record: Record, reason: str) -> None:
        self.sent.append((record, reason))

    def flush(self, timeout: float = 30.0) -> None:
        pass


class DeadLetters:
    """Copies rejected records to the dead-letter topic; flush() waits for Kafka's ack."""

    def __init__(self, producer: Producer, topic: str, metrics: Metrics | None = None) -> None:
        self.producer = producer
        self.topic = topic
        self.metrics = metrics or Metrics()
        self.count = 0
        self._errors: list[str] = []

    def send(self, record: Record, reason: str) -> None:
        logger.warning("dead-lettering record %s: %s", record.source, reason)

        def on_delivery(error: KafkaError | None, _: Any) -> None:
            if error is not None:
                self._errors.append(str(error))

        with kafka_errors(f"dead-letter record {record.source}"):
            self.producer.produce(self.topic, key=record.key, value=record.value,
                                  headers=[("reason", reason.encode("utf-8")),
                                           ("source", record.source.encode("utf-8"))],
                                  on_delivery=on_delivery)
        self.count += 1
        self.metrics.dead_lettered()

    def flush(self, timeout: float = 30.0) -> None:
        remaining = self.producer.flush(timeout)
        errors, self._errors = self._errors, []
        if remaining or errors:
            raise TaskLogError(f"dead-letter records not acknowledged: {errors or remaining}")
