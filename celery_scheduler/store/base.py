"""The schedule store's interface, split by who uses it.

- :class:`TaskWriter`: the schedule call's side, the dispatcher's ingest loop (put, cancel
  and retry records, decided from each key's status);
- :class:`ReleaseLedger`: the release engine (loading due rows, marking releases, recording
  retries, completions and workers' reports);
- :class:`LeaseTable`: which dispatcher owns which partition, and the fence on its writes;
- :class:`OperatorReads`: what the CLI, the HTTP API and the console show;
- :class:`PeriodicLog`: what each periodic entry fired last, and entries changed at run time;
- :class:`PauseTable`, :class:`RateLimitTable` and :class:`OperatorLog`: the operators'
  pauses, rate limits and log (these four are in :mod:`celery_scheduler.store.tables`);
- :class:`StatusReads`, a key's status, which all of them read.

:class:`ScheduleStore` is all of them, with the schema; the stores (``cassandra``,
``memory``) implement it, and each part of the package asks only for what it uses. The
records these return are in :mod:`celery_scheduler.store.records` (and importable from here).
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager

from celery_scheduler.envelope import ScheduleEnvelope
from celery_scheduler.keys import TaskKey
from celery_scheduler.store.records import (
    Cancel,
    Cursor,
    EntryChange,
    Lease,
    Operation,
    OperatorAction,
    Pause,
    PauseScope,
    Put,
    RateLimit,
    Reschedule,
    Retry,
    RunTimes,
    State,
    StoredTask,
    TaskStatus,
    bucket_of,
    droppable,
    settled_state,
    write_bucket,
)
from celery_scheduler.store.tables import OperatorLog, PauseTable, PeriodicLog, RateLimitTable

__all__ = ["Cancel", "Cursor", "EntryChange", "Lease", "LeaseTable", "Operation", "OperatorAction",
           "OperatorLog", "OperatorReads", "Pause", "PauseScope", "PauseTable", "PeriodicLog", "Put",
           "RateLimit", "RateLimitTable", "ReleaseLedger", "Reschedule", "Retry", "RunTimes",
           "ScheduleStore", "State", "StatusReads", "StoredTask", "TaskStatus", "TaskWriter", "bucket_of",
           "droppable", "settled_state", "write_bucket"]


class StatusReads(abc.ABC):
    """A task key's status, as every user of the store reads it."""

    @abc.abstractmethod
    def status(self, key: TaskKey) -> TaskStatus | None:
        """Return the status of *key*, or None if the store never saw it."""

    def statuses(self, keys: Sequence[TaskKey]) -> list[TaskStatus | None]:
        """The statuses of *keys*, in order (a store may read them concurrently)."""
        return [self.status(key) for key in keys]


class TaskWriter(StatusReads):
    """The schedule call's side: the dispatcher's ingest loop writes what the task log holds."""

    @abc.abstractmethod
    def put(self, partition: int, envelope: ScheduleEnvelope, now_ms: int) -> StoredTask | None:
        """Store a pending task; None if the key already finished, runs, waits for a retry, or
        was cancelled (a cancel is final, also against a schedule record read again).

        A pending key put again (its record read again after a failed batch, or scheduled
        again with new arguments) is overwritten in place, in the bucket it was first written
        to, never moved to a later one: the rows of an ordering id must stay in the order
        they were written, or a loader that stopped between them (an outage, a full window)
        would hold a later task of the ordering id without an earlier one, and release it
        first.
        """

    @abc.abstractmethod
    def cancel(self, partition: int, key: TaskKey, now_ms: int) -> bool:
        """Remove a pending (or blocked) task and mark it cancelled; False if there was none."""

    @abc.abstractmethod
    def retry(self, partition: int, key: TaskKey, now_ms: int) -> StoredTask | None:
        """Make the failed *key* pending again; None if it is not failed or cannot run again.

        A task blocked after its last attempt gets its row back unblocked; one that left the
        schedule gets a new row from the envelope its status kept (None if none was kept:
        it failed before this version). Its attempts so far stay counted: it is released
        once more, and if that attempt fails too it is failed (or blocked) again. Its
        ordering id's order holds as for any pending task: it runs before the later tasks
        of its ordering id that are still waiting, after any that is running.
        """

    @abc.abstractmethod
    def reschedule(self, partition: int, key: TaskKey, envelope: ScheduleEnvelope, now_ms: int,
                   data: bytes | None = None) -> StoredTask | None:
        """Move the pending *key* to *envelope*'s key (another time of its ordering id, maybe
        other arguments); the new key's stored task, or None if it may not move.

        The old key becomes ``rescheduled``, its status keeping *envelope* (see
        :meth:`kept_envelope`); the new key is put as a schedule record of it would be. Only
        a key never released moves (see ``lifecycle.reschedule_problem``), and only to a key
        that did not run or get cancelled. The move is written before the put, so a
        reschedule cut off half-way and applied again never leaves both keys to run.
        """

    @abc.abstractmethod
    def named_keys(self, names: Sequence[tuple[str, str]]) -> dict[tuple[str, str], TaskKey]:
        """The key each (ordering id, uniqueness key) of *names* was last scheduled under,
        for those scheduled with a task id of their own (see ``dispatcher.naming``)."""

    @abc.abstractmethod
    def name_keys(self, keys: Sequence[tuple[int, TaskKey]], now_ms: int) -> None:
        """Keep each of *keys* (with the partition it belongs to) as the one its ordering id
        and uniqueness key name, for as long as a finished task's status is kept after its
        time."""

    @abc.abstractmethod
    def kept_envelope(self, key: TaskKey) -> ScheduleEnvelope | None:
        """The envelope a failed *key*'s status kept for a retry, or the one a rescheduled
        key moved to; None if none."""

    def apply(self, operations: list[Operation], now_ms: int) -> list[StoredTask | bool | None]:
        """Apply puts, cancels, retries and reschedules of distinct keys, concurrently where
        the store can.

        Returns, per operation, what :meth:`put`, :meth:`cancel`, :meth:`retry` or
        :meth:`reschedule` would have returned.
        """
        if len({op.key for op in operations}) != len(operations):
            raise ValueError("apply() takes at most one operation per task key")
        results: list[StoredTask | bool | None] = []
        for op in operations:
            if isinstance(op, Put):
                results.append(self.put(op.partition, op.envelope, now_ms))
            elif isinstance(op, Retry):
                results.append(self.retry(op.partition, op.key, now_ms))
            elif isinstance(op, Reschedule):
                results.append(self.reschedule(op.partition, op.key, op.envelope, now_ms, op.data))
            else:
                results.append(self.cancel(op.partition, op.key, now_ms))
        return results


class ReleaseLedger(StatusReads):
    """The release engine's side: due rows loaded, releases marked, outcomes recorded."""

    bucket_seconds: int  # how wide the schedule's time buckets are

    @abc.abstractmethod
    def buckets(self, partition: int, first: int, last: int, limit: int = 100) -> list[int]:
        """Indexed buckets of *partition* between *first* and *last* (inclusive), ascending."""

    @abc.abstractmethod
    def read(self, partition: int, after: Cursor, limit: int, inclusive: bool = False
             ) -> list[StoredTask]:
        """Rows of bucket ``after.bucket`` past *after* (or at it, if *inclusive*), in order.

        Fewer than *limit* rows means the bucket has no more. A row found without its task
        is removed on the way, and its key's status settled (see :func:`settled_state`).
        """

    @abc.abstractmethod
    def drop_bucket(self, partition: int, bucket: int) -> None:
        """Remove an empty bucket from the index."""

    @abc.abstractmethod
    def mark_released(self, task: StoredTask, attempt: int, lease_until_ms: int, now_ms: int) -> None:
        """Record that *task* was released for the *attempt*-th time, leased until a time."""

    def mark_released_many(self, releases: Sequence[tuple[StoredTask, int, int]], now_ms: int) -> None:
        """:meth:`mark_released` for each (task, attempt, lease until), concurrently where the
        store can. If it raises, any of them may or may not be marked."""
        for task, attempt, lease_until_ms in releases:
            self.mark_released(task, attempt, lease_until_ms, now_ms)

    @abc.abstractmethod
    def mark_retry(self, task: StoredTask, attempts: int, not_before_ms: int, error: str | None,
                   now_ms: int) -> None:
        """Record a failed attempt; the task is pending again from *not_before_ms*."""

    @abc.abstractmethod
    def finish(self, task: StoredTask, state: State, error: str | None, now_ms: int,
               keep_row: bool = False, run: RunTimes | None = None) -> None:
        """Mark *task* finished (succeeded/failed); delete its row unless *keep_row* (blocked).

        *run* is what the status records of its times; None keeps the times the status has
        (an outcome recorded before, see :meth:`record_outcome`)."""

    def finish_many(self, tasks: Sequence[StoredTask], state: State, now_ms: int,
                    runs: Mapping[TaskKey, RunTimes] | None = None) -> None:
        """:meth:`finish` each task without a new error, deleting its row, concurrently where
        the store can, with its times from *runs*. If it raises, any of them may or may not
        be finished."""
        for task in tasks:
            self.finish(task, state, None, now_ms, run=(runs or {}).get(task.key))

    def mark_released_and_succeeded(self, releases: Sequence[tuple[StoredTask, int, int]],
                                    succeeded: Sequence[StoredTask], now_ms: int,
                                    runs: Mapping[TaskKey, RunTimes] | None = None) -> None:
        """:meth:`mark_released_many` of *releases* and :meth:`finish_many` of *succeeded*
        (as succeeded), concurrently where the store can: one wait for both. If it raises,
        any of them may or may not be written."""
        if releases:
            self.mark_released_many(releases, now_ms)
        if succeeded:
            self.finish_many(succeeded, State.SUCCEEDED, now_ms, runs)

    @abc.abstractmethod
    def record_outcome(self, partition: int, key: TaskKey, attempt: int, succeeded: bool,
                       error: str | None, now_ms: int, run: RunTimes | None = None,
                       generation: int = 0) -> None:
        """The worker's report of one attempt of a task of *partition* (the dispatcher acts
        on it), with the attempt's start and end in *run*, and which release of the attempt
        ran (*generation*, its start lease's end; 0: unknown)."""

    def record_outcomes(self, outcomes: Sequence[tuple[int, TaskKey, int, bool, str | None, int]],
                        now_ms: int, runs: Mapping[TaskKey, RunTimes] | None = None) -> None:
        """:meth:`record_outcome` for each (partition, key, attempt, succeeded, error,
        generation), concurrently where the store can. If it raises, any of them may or may
        not be recorded."""
        for partition, key, attempt, succeeded, error, generation in outcomes:
            self.record_outcome(partition, key, attempt, succeeded, error, now_ms,
                                (runs or {}).get(key), generation)


class LeaseTable(abc.ABC):
    """Which dispatcher owns which partition: leases, and the fence on an owner's writes."""

    @abc.abstractmethod
    def acquire_lease(self, partition: int, owner: str, ttl_ms: int, now_ms: int) -> Lease | None:
        """Take *partition* if it is free, expired or already ours; None if someone holds it."""

    @abc.abstractmethod
    def renew_lease(self, lease: Lease, ttl_ms: int, now_ms: int) -> Lease | None:
        """Extend *lease*; None if it was lost (another owner took the partition)."""

    def acquire_leases(self, partitions: Sequence[int], owner: str, ttl_ms: int, now_ms: int
                       ) -> dict[int, Lease]:
        """:meth:`acquire_lease` for each of *partitions*: the leases taken, by partition.

        A store may take them together, all or none (the Cassandra store does): a partition
        not taken this time is asked for again later.
        """
        taken = {}
        for partition in partitions:
            lease = self.acquire_lease(partition, owner, ttl_ms, now_ms)
            if lease is not None:
                taken[partition] = lease
        return taken

    def renew_leases(self, leases: Sequence[Lease], ttl_ms: int, now_ms: int) -> list[Lease | None]:
        """:meth:`renew_lease` for each of *leases*, in order (the Cassandra store renews them
        with one lightweight transaction)."""
        return [self.renew_lease(lease, ttl_ms, now_ms) for lease in leases]

    @abc.abstractmethod
    def release_lease(self, lease: Lease) -> None:
        """Give *lease* up so the next owner need not wait for it to expire."""

    def fence_writes(self, fence: Callable[[int], float | None]) -> None:
        """Stamp each write of a partition no later than *fence(partition)* (wall-clock
        seconds; None: no limit).

        A dispatcher passes the end of its lease of the partition, so that a write it sends
        late (after a pause) loses to the writes of the partition's next owner. A store
        whose writes apply in the order they are made (the memory store) has nothing to do.
        """

    def refusing_late_writes(self) -> AbstractContextManager[None]:
        """Within the block, a write of this thread that would be stamped past its
        partition's fence is not sent: it raises
        :class:`~celery_scheduler.errors.LeaseEndedError`.

        For writes decided from what was read (a periodic occurrence fired because the run
        before had started): held at the fence, such a write would stay where the next owner,
        deciding otherwise, wrote nothing. A store whose writes apply in the order they are
        made (the memory store) refuses nothing.
        """
        return contextlib.nullcontext()


class OperatorReads(StatusReads):
    """What operators look at (read only): the CLI, the HTTP API and the console."""

    @abc.abstractmethod
    def task(self, key: TaskKey) -> StoredTask | None:
        """The stored row of *key* (its task and dispatch state), or None if it has none."""

    @abc.abstractmethod
    def leases(self) -> list[Lease]:
        """The lease of every partition that was ever leased, by partition."""

    @abc.abstractmethod
    def backlog(self, partition: int) -> tuple[int, int | None]:
        """How many rows *partition* holds, and the earliest scheduled time among them."""

    @abc.abstractmethod
    def statuses_in_state(self, state: State, limit: int) -> list[TaskStatus]:
        """Up to *limit* statuses in *state*, in no particular order (a scan: for operators)."""

    @abc.abstractmethod
    def bucket_sizes(self, partition: int, first: int, last: int) -> dict[int, int]:
        """Rows per indexed bucket of *partition* between *first* and *last* (inclusive)."""

    @abc.abstractmethod
    def rows_of(self, partition: int, ordering_id: str, limit: int = 1000) -> list[StoredTask]:
        """The rows of *ordering_id* (in *partition*) still in the schedule, in schedule order."""


class ScheduleStore(TaskWriter, ReleaseLedger, LeaseTable, OperatorReads, PeriodicLog, PauseTable,
                    RateLimitTable, OperatorLog):
    """Persists pending tasks by (partition, time), task status by key, and partition leases."""

    bucket_seconds: int

    @abc.abstractmethod
    def create_schema(self, status_shards: int | None = None) -> int:
        """Create the keyspace and tables if they do not exist (idempotent).

        *status_shards*: for a new keyspace, how many shards its statuses are spread over
        (the topic's partition count, see :mod:`celery_scheduler.store.status_layout`).
        Returns how many statuses were moved from an earlier version's table.
        """

    def check_schema(self) -> None:
        """Raise :class:`SchemaMissingError` if the store lacks something this version writes."""

    @abc.abstractmethod
    def drop_schema(self) -> bool:
        """Delete the keyspace with everything in it; False if there was none."""

    def close(self) -> None:
        """Release connections."""

    def __enter__(self) -> ScheduleStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
