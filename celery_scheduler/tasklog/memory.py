"""An in-process task log for unit tests and the testing helper."""

from __future__ import annotations

import threading
from concurrent.futures import Future

from celery_scheduler.partitioner import partition_for
from celery_scheduler.tasklog.base import Position, TaskLog

__all__ = ["MemoryTaskLog"]


class MemoryTaskLog(TaskLog):
    """Keeps every record in lists, one per partition, partitioned as Kafka would."""

    def __init__(self, partitions: int = 12) -> None:
        self._records: list[list[tuple[str, bytes]]] = [[] for _ in range(partitions)]
        self.headers: list[list[dict[str, bytes]]] = [[] for _ in range(partitions)]
        self._lock = threading.Lock()

    def publish_async(self, key: str, value: bytes, headers: dict[str, bytes] | None = None
                      ) -> Future[Position]:
        partition = partition_for(key, len(self._records))
        with self._lock:
            self._records[partition].append((key, bytes(value)))
            self.headers[partition].append(dict(headers or {}))
            position = Position(partition, len(self._records[partition]) - 1)
        future: Future[Position] = Future()
        future.set_result(position)
        return future

    def flush(self, timeout: float | None = None) -> int:
        return 0

    def partitions(self) -> int:
        return len(self._records)

    def records(self, partition: int | None = None) -> list[tuple[str, bytes]]:
        """Return the (key, value) records of one partition, or of all in partition order."""
        with self._lock:
            if partition is not None:
                return list(self._records[partition])
            return [record for records in self._records for record in records]
