"""The dispatcher's side of the task log: Kafka consumers seen through the reader port.

Every failure of a consumer call leaves here as a
:class:`~celery_scheduler.errors.TaskLogError` (a broker that cannot be reached as
:class:`~celery_scheduler.errors.TaskLogUnavailableError`), the way the producer's failures
leave :mod:`celery_scheduler.tasklog.kafka` and Cassandra's leave the store: the dispatcher
handles the package's errors, never the client library's.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Literal

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from celery_scheduler.errors import TaskLogError, TaskLogUnavailableError

__all__ = ["KafkaTaskLogReader", "close_aside", "end_offsets", "kafka_errors"]

logger = logging.getLogger(__name__)

# How long the ingest loop waits to hear where a partition ends (it is the loop's thread).
END_OFFSET_TIMEOUT = 1.0

# Codes that say the brokers could not be reached or answered too late: waiting may cure them.
_UNAVAILABLE = frozenset({
    KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT,
    KafkaError.REQUEST_TIMED_OUT, KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.NETWORK_EXCEPTION,
    KafkaError.LEADER_NOT_AVAILABLE, KafkaError.NOT_LEADER_FOR_PARTITION,
})


@contextlib.contextmanager
def kafka_errors(what: str) -> Iterator[None]:
    """Turn the Kafka client's exceptions raised inside the block into TaskLogErrors."""
    try:
        yield
    except BufferError as exc:  # a producer's queue is full
        raise TaskLogUnavailableError(f"Kafka could not {what}: the client's queue is full") from exc
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        text = error.str() if isinstance(error, KafkaError) else str(exc)
        if isinstance(error, KafkaError) and error.code() in _UNAVAILABLE:
            raise TaskLogUnavailableError(f"Kafka could not {what}: {text}") from exc
        raise TaskLogError(f"Kafka could not {what}: {text}") from exc


class KafkaTaskLogReader:
    """A consumer of the scheduler topic's group, as the ingest loop reads it.

    ``consumer`` stays reachable for what only the dispatcher's wiring does with it
    (subscribing with the rebalance callbacks, closing).
    """

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        with kafka_errors("read the scheduler topic"):
            messages: list[Message] = self.consumer.consume(num_messages, timeout)
            return messages

    def seek(self, partition: TopicPartition) -> None:
        with kafka_errors(f"seek partition {partition.partition} to {partition.offset}"):
            self.consumer.seek(partition)

    def pause(self, partitions: list[TopicPartition]) -> None:
        with kafka_errors("pause partitions"):
            self.consumer.pause(partitions)

    def resume(self, partitions: list[TopicPartition]) -> None:
        with kafka_errors("resume partitions"):
            self.consumer.resume(partitions)

    def commit(self, *, offsets: list[TopicPartition], asynchronous: Literal[True] = True) -> None:
        with kafka_errors("commit offsets"):
            self.consumer.commit(offsets=offsets, asynchronous=asynchronous)

    def end_offsets(self, partitions: list[TopicPartition]) -> dict[int, int]:
        return end_offsets(self.consumer, partitions, END_OFFSET_TIMEOUT)

    def replace(self, consumer: Consumer) -> Consumer:
        """Read through *consumer* from now on; return the one it replaces (not closed)."""
        old, self.consumer = self.consumer, consumer
        return old

    def close(self) -> None:
        with kafka_errors("close the consumer"):
            self.consumer.close()


def end_offsets(consumer: Consumer, partitions: list[TopicPartition],
                timeout: float) -> dict[int, int]:
    """Where each of *partitions* ends (the offset the next message will take), asked in one
    request per leader; a partition Kafka gave no answer for is left out. Raises
    ``TaskLogError`` when Kafka does not answer within *timeout* seconds."""
    asked = [TopicPartition(tp.topic, tp.partition, -1) for tp in partitions]  # -1: the latest
    with kafka_errors("ask where the partitions end"):
        answer = consumer.offsets_for_times(asked, timeout=timeout)
    return {tp.partition: tp.offset for tp in answer if tp.error is None and tp.offset >= 0}


def close_aside(consumer: Consumer, what: str) -> None:
    """Close *consumer*, one no longer read, on a thread of its own (a consumer that stopped
    working may take long to close); its errors are only logged."""

    def close() -> None:
        try:
            with kafka_errors(f"close {what}"):
                consumer.close()
        except TaskLogError as exc:
            logger.info("%s", exc)

    threading.Thread(target=close, daemon=True, name="celery-scheduler-consumer-close").start()
