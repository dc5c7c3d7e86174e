"""The task log interface."""

from __future__ import annotations

import abc
from concurrent.futures import Future
from typing import NamedTuple

__all__ = ["Position", "TaskLog"]


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
                "it may still arrive, and scheduling the same task key again is safe"
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
