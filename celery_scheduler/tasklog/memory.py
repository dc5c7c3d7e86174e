"""An in-process task log for unit tests and the testing helper."""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterable, Mapping

from celery_scheduler.partitioner import partition_for
from celery_scheduler.signing import HEADER as SIGNATURE_HEADER
from celery_scheduler.tasklog.base import Ack, PartitionEnd, Position, Read, Record, TaskLog

__all__ = ["MemoryTaskLog", "MemoryTaskLogReader"]


class MemoryTaskLog(TaskLog):
    """Keeps every record in lists, one per partition, partitioned as Kafka would."""

    def __init__(self, partitions: int = 12) -> None:
        self._records: list[list[tuple[str, bytes]]] = [[] for _ in range(partitions)]
        self.headers: list[list[dict[str, bytes]]] = [[] for _ in range(partitions)]
        self._lock = threading.Lock()

    def publish_async(self, key: str, value: bytes, headers: dict[str, bytes] | None = None
                      ) -> Ack:
        partition = partition_for(key, len(self._records))
        with self._lock:
            self._records[partition].append((key, bytes(value)))
            self.headers[partition].append(dict(headers or {}))
            position = Position(partition, len(self._records[partition]) - 1)
        return Ack.of(position)

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


class MemoryTaskLogReader:
    """Reads a :class:`MemoryTaskLog` as a member of a consumer group would.

    It reads the partitions assigned to it (all of them unless told), from the group's
    committed offsets: readers that share *committed* are members of one group, and a
    partition assigned to another member is read from where the group committed it. With
    *partition_eof*, a partition read to its end gives an end-of-partition event once, as
    Kafka's consumer does with ``enable.partition.eof``. See
    :class:`~celery_scheduler.tasklog.base.TaskLogReader`.
    """

    def __init__(self, log: MemoryTaskLog, topic: str, committed: list[int] | None = None,
                 assigned: Iterable[int] | None = None, *, partition_eof: bool = False) -> None:
        self.log = log
        self.topic = topic
        self.committed = committed if committed is not None else [0] * log.partitions()
        self.partition_eof = partition_eof
        self._positions: dict[int, int] = {}
        self._paused: set[int] = set()
        self._at_end: set[int] = set()  # end-of-partition event given, nothing read since
        self.assign(range(log.partitions()) if assigned is None else assigned)

    def assign(self, partitions: Iterable[int]) -> None:
        """The group gave this member *partitions*: read them from the committed offsets."""
        for partition in partitions:
            self._positions[partition] = self.committed[partition]
            self._paused.discard(partition)
            self._at_end.discard(partition)

    def revoke(self, partitions: Iterable[int]) -> None:
        for partition in partitions:
            self._positions.pop(partition, None)
            self._paused.discard(partition)

    def consume(self, num_messages: int = 1, timeout: float = 0.0) -> list[Read]:
        read: list[Read] = []
        for partition, position in sorted(self._positions.items()):
            if partition in self._paused:
                continue
            with self.log._lock:
                records = self.log._records[partition][position:]
                headers = self.log.headers[partition][position:]
            for offset, ((key, value), header) in enumerate(zip(records, headers, strict=True),
                                                            start=position):
                if len(read) >= num_messages:
                    return read
                read.append(Record(self.topic, partition, offset, key.encode("utf-8"), value,
                                   header.get(SIGNATURE_HEADER)))
                self._positions[partition] = offset + 1
                self._at_end.discard(partition)
            if self.partition_eof and partition not in self._at_end and len(read) < num_messages:
                self._at_end.add(partition)
                read.append(PartitionEnd(partition, self._positions[partition]))
        return read

    def seek(self, partition: int, offset: int) -> None:
        if partition in self._positions:  # Kafka refuses it for another's partition
            self._positions[partition] = offset
            self._at_end.discard(partition)

    def pause(self, partitions: Collection[int]) -> None:
        self._paused.update(p for p in partitions if p in self._positions)

    def resume(self, partitions: Collection[int]) -> None:
        self._paused.difference_update(partitions)

    def commit(self, offsets: Mapping[int, int]) -> None:
        for partition, offset in offsets.items():
            self.committed[partition] = max(self.committed[partition], offset)

    def end_offsets(self, partitions: Collection[int]) -> dict[int, int]:
        with self.log._lock:
            return {partition: len(self.log._records[partition]) for partition in partitions}

    def lag(self) -> int:
        """Records of the assigned partitions not read yet (paused ones included)."""
        with self.log._lock:
            return sum(len(self.log._records[partition]) - position
                       for partition, position in self._positions.items())
