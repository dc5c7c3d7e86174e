"""The task log interface."""

from __future__ import annotations

import abc
from concurrent.futures import Future
from typing import Literal, NamedTuple, Protocol

from confluent_kafka import Message, TopicPartition

__all__ = ["UNACKNOWLEDGED", "Position", "TaskLog", "TaskLogReader"]

# Said by every error for a record that was sent but not acknowledged: the caller must not
# read it as "the task will not run".
UNACKNOWLEDGED = (
    "the record may still have reached Kafka, so the task may still run; to be sure it is "
    "scheduled, make the same call again with the same time (schedule_at, not schedule_in) "
    "and arguments: the same task key runs once"
)


class Position(NamedTuple):
    """Where an acknowledged record landed."""

    partition: int
    offset: int


class TaskLog(abc.ABC):
    """Append-only, partitioned log of envelopes; records of one key keep their order."""

    @abc.abstractmethod
    def publish_async(self, key: str, value: bytes, headers: dict[str, bytes] | None = None
                      ) -> Future[Position]:
        """Start appending *value* under *key*; the future resolves once it is acknowledged.

        The future fails with a :class:`~celery_scheduler.errors.TaskLogError`.
        """

    def publish(self, key: str, value: bytes, timeout: float | None = None,
                headers: dict[str, bytes] | None = None) -> Position:
        """Append *value* under *key* and wait until it is acknowledged (or raise)."""
        from celery_scheduler.errors import TaskLogUnavailableError

        future = self.publish_async(key, value, headers)
        try:
            return future.result(timeout)
        except TimeoutError:
            raise TaskLogUnavailableError(
                f"the task log did not acknowledge the record for {key!r} within {timeout}s; "
                + UNACKNOWLEDGED
            ) from None

    @abc.abstractmethod
    def flush(self, timeout: float | None = None) -> int:
        """Wait for outstanding records; return how many are still unacknowledged."""

    @abc.abstractmethod
    def partitions(self) -> int:
        """Return the number of partitions of the log."""

    def close(self) -> None:
        """Flush and release resources."""
        self.flush()

    def __enter__(self) -> TaskLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class TaskLogReader(Protocol):
    """What a dispatcher's ingest loop reads the task log with: Kafka's consumer calls.

    The Kafka consumer of a consumer group is one; :class:`MemoryTaskLogReader` reads a
    :class:`MemoryTaskLog` the same way. Messages and positions are Kafka's own types.
    """

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        """Up to *num_messages* records after each partition's position, in order."""

    def seek(self, partition: TopicPartition) -> None:
        """Read *partition.partition* from *partition.offset* on."""

    def pause(self, partitions: list[TopicPartition]) -> None:
        """Return nothing of *partitions* until they are resumed."""

    def resume(self, partitions: list[TopicPartition]) -> None:
        """Undo :meth:`pause`."""

    def commit(self, *, offsets: list[TopicPartition], asynchronous: Literal[True] = ...) -> None:
        """Record that everything before each offset is done (the group resumes there)."""
