"""The task log's ports: what the producer side publishes with, and what a dispatcher reads.

Both speak the package's own types (:class:`Record`, :class:`PartitionEnd`, partition
numbers and offsets): the Kafka client's stay in :mod:`celery_scheduler.tasklog.kafka` and
:mod:`celery_scheduler.tasklog.reader`, so the dispatcher imports no driver.
"""

from __future__ import annotations

import abc
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import NamedTuple, Protocol

__all__ = ["UNACKNOWLEDGED", "Ack", "BatchAck", "Headers", "PartitionEnd", "Position", "Read",
           "Record", "TaskLog", "TaskLogReader"]

# The headers of a batch's record, made from its key and value (such as its signature).
Headers = Callable[[str, bytes], dict[str, bytes]]

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


# Made at most once per acknowledgement, and only when somebody waits for it.
_event_lock = threading.Lock()


class Ack:
    """The acknowledgement of one record: where it landed, or why the log did not take it.

    ``publish_async`` returns one. It answers ``done()``, ``result(timeout)`` and
    ``exception(timeout)`` as a :class:`concurrent.futures.Future` does, for a fraction of the
    cost: a batched schedule call makes one per record, and a Future's condition and lock,
    made for every record and taken again by its delivery report, were a tenth of the call.
    Here a waiter's event is made only when somebody waits.

    The first :meth:`settle` counts; a later one is ignored.
    """

    __slots__ = ("_done", "_error", "_event", "_position")

    def __init__(self) -> None:
        self._done = False
        self._position: Position | None = None
        self._error: BaseException | None = None
        self._event: threading.Event | None = None

    @classmethod
    def of(cls, position: Position) -> Ack:
        """An acknowledgement that has already come."""
        ack = cls()
        ack.settle(position)
        return ack

    def settle(self, position: Position | None, error: BaseException | None = None) -> bool:
        """Record the outcome (*error*, or else *position*); False if it was settled before.

        Called by one thread per record (the one that took its report off a queue), so the
        test-and-set below needs no lock.
        """
        if self._done:
            return False
        self._position, self._error = position, error
        self._done = True
        # a waiter makes its event before it looks at _done: either it sees _done, or this
        # sees its event
        event = self._event
        if event is not None:
            event.set()
        return True

    def done(self) -> bool:
        return self._done

    def _wait(self, timeout: float | None) -> None:
        if self._done:
            return
        with _event_lock:
            if self._event is None:
                self._event = threading.Event()
        if not self._done and not self._event.wait(timeout):
            raise TimeoutError(f"no acknowledgement within {timeout}s")

    def result(self, timeout: float | None = None) -> Position:
        """The record's position; raises its error, or ``TimeoutError`` after *timeout* s."""
        self._wait(timeout)
        if self._error is not None:
            raise self._error
        assert self._position is not None
        return self._position

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The record's error, None if it was acknowledged; ``TimeoutError`` after *timeout*."""
        self._wait(timeout)
        return self._error

    def __repr__(self) -> str:
        state = "pending" if not self._done else repr(self._error or self._position)
        return f"<Ack {state}>"


class BatchAck:
    """The acknowledgement of a batch of records (``publish_many``): done once every record
    was acknowledged or failed.

    :meth:`wait` raises :class:`~celery_scheduler.errors.TaskLogUnavailableError` when some
    were not acknowledged; :meth:`failed` returns them, as (key, value), so that they can be
    published again (records are envelopes: publishing one again is safe).
    """

    def __init__(self, count: int) -> None:
        self.count = count
        self._failed: list[tuple[str, bytes, BaseException]] = []
        self._done = threading.Event()

    def done(self) -> bool:
        return self._done.is_set()

    def failed(self) -> list[tuple[str, bytes]]:
        """The records not acknowledged so far (all of them are known once done)."""
        return [(key, value) for key, value, _ in list(self._failed)]

    def wait(self, timeout: float | None = None) -> None:
        """Block until every record is acknowledged; raise if one was not, or on *timeout*."""
        from celery_scheduler.errors import TaskLogUnavailableError

        if not self._wait_done(timeout):
            raise TaskLogUnavailableError(
                f"the task log did not acknowledge all {self.count} record(s) of a batch within "
                f"{timeout}s; " + UNACKNOWLEDGED)
        failed = list(self._failed)
        if failed:
            error = failed[0][2]
            raise TaskLogUnavailableError(
                f"{len(failed)} of {self.count} record(s) of a batch were not acknowledged "
                f"(the first: {error}); " + UNACKNOWLEDGED) from error

    def _wait_done(self, timeout: float | None) -> bool:
        return self._done.wait(timeout)

    def _fail(self, key: str, value: bytes, error: BaseException) -> None:
        self._failed.append((key, value, error))

    def _finish(self) -> None:
        self._done.set()

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<BatchAck {self.count} record(s), {state}, {len(self._failed)} failed>"


class _AcksBatch(BatchAck):
    """A batch published record by record: done once each record's Ack is."""

    def __init__(self, records: list[tuple[str, bytes, Ack]]) -> None:
        super().__init__(len(records))
        self._records = records
        self._watch()

    def _watch(self) -> None:
        for _, _, ack in self._records:
            if not ack.done():
                return
        for key, value, ack in self._records:
            error = ack.exception(0)
            if error is not None:
                self._fail(key, value, error)
        self._finish()

    def done(self) -> bool:
        if not self._done.is_set():
            self._watch()
        return self._done.is_set()

    def _wait_done(self, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        for _, _, ack in self._records:
            try:
                ack.exception(None if deadline is None else max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                return False
        return self.done()


class TaskLog(abc.ABC):
    """Append-only, partitioned log of envelopes; records of one key keep their order."""

    @abc.abstractmethod
    def publish_async(self, key: str, value: bytes, headers: dict[str, bytes] | None = None
                      ) -> Ack:
        """Start appending *value* under *key*; the ack settles once Kafka acknowledged it.

        It fails with a :class:`~celery_scheduler.errors.TaskLogError`.
        """

    def publish(self, key: str, value: bytes, timeout: float | None = None,
                headers: dict[str, bytes] | None = None) -> Position:
        """Append *value* under *key* and wait until it is acknowledged (or raise)."""
        from celery_scheduler.errors import TaskLogUnavailableError

        ack = self.publish_async(key, value, headers)
        try:
            return ack.result(timeout)
        except TimeoutError:
            raise TaskLogUnavailableError(
                f"the task log did not acknowledge the record for {key!r} within {timeout}s; "
                + UNACKNOWLEDGED
            ) from None

    def publish_many(self, records: Collection[tuple[str, bytes]],
                     headers: Headers | None = None) -> BatchAck:
        """Start appending each (key, value) record, in order, with ``headers(key, value)``
        if given; one acknowledgement for all. *records* are taken one at a time, as they
        are appended (they may be made as they are taken)."""
        return _AcksBatch([
            (key, value, self.publish_async(key, value, None if headers is None
                                            else headers(key, value)))
            for key, value in records])

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


@dataclass(frozen=True)
class Record:
    """A record read from the scheduler topic: the parts of it the dispatcher uses."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    signature: bytes | None = None

    @property
    def source(self) -> str:
        return f"{self.topic}/{self.partition}/{self.offset}"


class PartitionEnd(NamedTuple):
    """A partition was read to its end: the next record will take *offset*."""

    partition: int
    offset: int


# What a read returns: records, and the ends of the partitions it read to their end.
Read = Record | PartitionEnd


class TaskLogReader(Protocol):
    """What a dispatcher's ingest loop reads the task log with: one topic's partitions, by
    number, as a member of the dispatchers' group (or, for kept partitions, beside it).

    :class:`~celery_scheduler.tasklog.reader.KafkaTaskLogReader` reads Kafka;
    :class:`~celery_scheduler.tasklog.memory.MemoryTaskLogReader` a
    :class:`MemoryTaskLog`. Every failure is a
    :class:`~celery_scheduler.errors.TaskLogError`.
    """

    topic: str

    def consume(self, num_messages: int = 1, timeout: float = 0.0) -> list[Read]:
        """Up to *num_messages* records after each partition's position, in order, with a
        :class:`PartitionEnd` where a partition was read to its end; waiting at most
        *timeout* seconds for the first of them (a negative one: not at all, never forever)."""

    def seek(self, partition: int, offset: int) -> None:
        """Read *partition* from *offset* on."""

    def pause(self, partitions: Collection[int]) -> None:
        """Return nothing of *partitions* until they are resumed."""

    def resume(self, partitions: Collection[int]) -> None:
        """Undo :meth:`pause`."""

    def commit(self, offsets: Mapping[int, int]) -> None:
        """Record, without waiting, that everything before each partition's offset is done
        (the group resumes there)."""

    def end_offsets(self, partitions: Collection[int]) -> dict[int, int]:
        """Per partition, the offset after the last record the broker holds, asked of it now
        (one request); a partition it did not answer for is left out."""
