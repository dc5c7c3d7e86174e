"""An in-process schedule store for unit tests and the testing helper."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace

from celery_scheduler import clock
from celery_scheduler.envelope import ScheduleEnvelope
from celery_scheduler.keys import TaskKey
from celery_scheduler.store import lifecycle
from celery_scheduler.store.base import (
    Cursor,
    EntryChange,
    Lease,
    OperatorAction,
    Pause,
    PauseScope,
    RateLimit,
    RunTimes,
    ScheduleStore,
    State,
    StoredTask,
    TaskStatus,
)
from celery_scheduler.store.lifecycle import RowKind, Transition

__all__ = ["MemoryScheduleStore"]


def _past(position: Cursor, after: Cursor, inclusive: bool) -> bool:
    """Whether a read from *after* (at it too, if *inclusive*) reaches *position*."""
    return position >= after if inclusive else position > after


class MemoryScheduleStore(ScheduleStore):
    """Same semantics as the Cassandra store, kept in dictionaries."""

    def __init__(self, bucket_seconds: int = 60) -> None:
        self.bucket_seconds = bucket_seconds
        self._rows: dict[tuple[int, int], dict[TaskKey, StoredTask]] = {}
        self._index: dict[int, set[int]] = {}
        self._status: dict[TaskKey, TaskStatus] = {}
        self._leases: dict[int, Lease] = {}
        # Rows a dispatch update re-created without their task after a cancel or a completion
        # deleted them, as Cassandra's updates do (see settled_state).
        self._remnants: dict[tuple[int, int], set[TaskKey]] = {}
        # Envelopes of failed tasks whose rows are gone, kept for a retry.
        self._kept: dict[TaskKey, ScheduleEnvelope] = {}
        # partition -> periodic entry -> its latest occurrence fired
        self._fired: dict[int, dict[str, int]] = {}
        self._changes: dict[str, EntryChange] = {}  # periodic entries changed at run time
        self._pauses: dict[tuple[PauseScope, str], Pause] = {}
        self._limits: dict[tuple[PauseScope, str], RateLimit] = {}
        self._names: dict[tuple[str, str], TaskKey] = {}  # see named_keys
        self._actions: list[OperatorAction] = []  # the operators' log, oldest first
        self._lock = threading.Lock()

    def create_schema(self, status_shards: int | None = None) -> int:
        return 0

    def drop_schema(self) -> bool:
        with self._lock:
            held = bool(self._rows or self._status or self._leases or self._fired or self._changes
                        or self._pauses or self._limits or self._actions)
            for table in (self._rows, self._index, self._status, self._leases, self._remnants,
                          self._kept, self._fired, self._changes, self._pauses, self._limits,
                          self._names, self._actions):
                table.clear()
        return held

    def last_fired(self, partition: int) -> dict[str, int]:
        with self._lock:
            return dict(self._fired.get(partition, {}))

    def note_fired(self, partition: int, fired: Mapping[str, int]) -> None:
        with self._lock:
            self._fired.setdefault(partition, {}).update(fired)

    def entry_changes(self) -> dict[str, EntryChange]:
        with self._lock:
            return dict(self._changes)

    def change_entry(self, change: EntryChange) -> None:
        with self._lock:
            self._changes[change.name] = change

    def forget_entry_change(self, name: str) -> None:
        with self._lock:
            self._changes.pop(name, None)

    def pauses(self) -> list[Pause]:
        with self._lock:
            return list(self._pauses.values())

    def put_pause(self, pause: Pause) -> None:
        with self._lock:
            self._pauses[(pause.scope, pause.value)] = pause

    def drop_pause(self, scope: PauseScope, value: str) -> None:
        with self._lock:
            self._pauses.pop((scope, value), None)

    def rate_limits(self) -> list[RateLimit]:
        with self._lock:
            return list(self._limits.values())

    def put_rate_limit(self, limit: RateLimit) -> None:
        with self._lock:
            self._limits[(limit.scope, limit.value)] = limit

    def drop_rate_limit(self, scope: PauseScope, value: str) -> None:
        with self._lock:
            self._limits.pop((scope, value), None)

    def note_action(self, action: OperatorAction) -> None:
        with self._lock:
            self._actions.append(action)

    def actions(self, limit: int, now_ms: int) -> list[OperatorAction]:
        with self._lock:
            # newest first; of one millisecond, the last written first (as Cassandra's timeuuid)
            return sorted(reversed(self._actions), key=lambda a: a.at_ms, reverse=True)[:limit]

    def _set_row(self, task: StoredTask) -> None:
        self._rows.setdefault((task.partition, task.bucket), {})[task.key] = task
        self._index.setdefault(task.partition, set()).add(task.bucket)
        self._remnants.get((task.partition, task.bucket), set()).discard(task.key)

    def _delete_row(self, partition: int, bucket: int | None, key: TaskKey) -> None:
        if bucket is not None:
            self._rows.get((partition, bucket), {}).pop(key, None)
            self._remnants.get((partition, bucket), set()).discard(key)

    def _apply(self, transition: Transition | None) -> Transition | None:
        """Write *transition* (see store.lifecycle) as Cassandra's statements would."""
        if transition is None:
            return None
        key, row = transition.key, transition.row
        if row is not None and row.kind is RowKind.INSERT:
            assert row.task is not None
            if row.moved_from is not None:
                self._delete_row(*row.moved_from, key)
            self._set_row(row.task)
        elif row is not None and row.kind is RowKind.DELETE:
            self._delete_row(row.partition, row.bucket, key)
        elif row is not None:
            stored = self._rows.get((row.partition, row.bucket), {}).get(key)
            if stored is None:  # an update re-creates the row, without its task
                self._remnants.setdefault((row.partition, row.bucket), set()).add(key)
            else:
                self._set_row(replace(stored, **row.fields))  # type: ignore[arg-type]
        fields = transition.status
        if "envelope" in fields:
            envelope = fields.pop("envelope")
            if isinstance(envelope, ScheduleEnvelope):
                self._kept[key] = envelope
            else:
                self._kept.pop(key, None)
        current = self._status.get(key)
        if current is not None and fields:
            self._status[key] = replace(current, **fields)  # type: ignore[arg-type]
        elif fields and transition.event is lifecycle.Event.SCHEDULE:
            self._status[key] = TaskStatus(key=key, **fields)  # type: ignore[arg-type]
        return transition

    def put(self, partition: int, envelope: ScheduleEnvelope, now_ms: int) -> StoredTask | None:
        with self._lock:
            transition = self._apply(lifecycle.scheduled(
                partition, envelope, self._status.get(envelope.key), now_ms, self.bucket_seconds))
            return None if transition is None or transition.row is None else transition.row.task

    def cancel(self, partition: int, key: TaskKey, now_ms: int) -> bool:
        with self._lock:
            current = self._status.get(key)
            row_kept = current is not None and key in self._rows.get(
                (current.partition, current.bucket or 0), {})
            return self._apply(lifecycle.cancelled(current, now_ms, row_kept=row_kept)) is not None

    def retry(self, partition: int, key: TaskKey, now_ms: int) -> StoredTask | None:
        with self._lock:
            current = self._status.get(key)
            row = (self._rows.get((current.partition, current.bucket or 0), {}).get(key)
                   if current is not None else None)
            transition = self._apply(lifecycle.retried(partition, current, row, self._kept.get(key),
                                                       now_ms, self.bucket_seconds))
            return None if transition is None or transition.row is None else transition.row.task

    def reschedule(self, partition: int, key: TaskKey, envelope: ScheduleEnvelope, now_ms: int,
                   data: bytes | None = None) -> StoredTask | None:
        with self._lock:
            current = self._status.get(key)
            moved = (self._kept.get(key)
                     if current is not None and current.state is State.RESCHEDULED else None)
            planned = lifecycle.rescheduled(partition, current, moved.key if moved else None, envelope,
                                            self._status.get(envelope.key), now_ms, self.bucket_seconds)
            if planned is None:
                return None
            move, put = planned
            self._apply(move)
            self._apply(put)
            return None if put is None or put.row is None else put.row.task

    def named_keys(self, names: Sequence[tuple[str, str]]) -> dict[tuple[str, str], TaskKey]:
        with self._lock:
            return {name: self._names[name] for name in names if name in self._names}

    def name_keys(self, keys: Sequence[tuple[int, TaskKey]], now_ms: int) -> None:
        with self._lock:
            self._names.update(((key.ordering_id, key.uniqueness_key), key) for _, key in keys)

    def kept_envelope(self, key: TaskKey) -> ScheduleEnvelope | None:
        with self._lock:
            return self._kept.get(key)

    def status(self, key: TaskKey) -> TaskStatus | None:
        with self._lock:
            return self._status.get(key)

    def task(self, key: TaskKey) -> StoredTask | None:
        with self._lock:
            current = self._status.get(key)
            if current is None or current.bucket is None:
                return None
            return self._rows.get((current.partition, current.bucket), {}).get(key)

    def leases(self) -> list[Lease]:
        with self._lock:
            return [self._leases[n] for n in sorted(self._leases)]

    def backlog(self, partition: int) -> tuple[int, int | None]:
        with self._lock:
            times = [key.scheduled_ms for (number, _), rows in self._rows.items()
                     if number == partition for key in rows]
        return len(times), min(times, default=None)

    def statuses_in_state(self, state: State, limit: int) -> list[TaskStatus]:
        with self._lock:
            return [status for status in self._status.values() if status.state is state][:limit]

    def bucket_sizes(self, partition: int, first: int, last: int) -> dict[int, int]:
        with self._lock:
            return {bucket: len(rows) for (number, bucket), rows in self._rows.items()
                    if number == partition and first <= bucket <= last and rows}

    def rows_of(self, partition: int, ordering_id: str, limit: int = 1000) -> list[StoredTask]:
        with self._lock:
            rows = [row for (number, _), bucket in self._rows.items() if number == partition
                    for key, row in bucket.items() if key.ordering_id == ordering_id]
        return sorted(rows, key=lambda row: row.position)[:limit]

    def buckets(self, partition: int, first: int, last: int, limit: int = 100) -> list[int]:
        with self._lock:
            found = sorted(b for b in self._index.get(partition, ()) if first <= b <= last)
        return found[:limit]

    def read(self, partition: int, after: Cursor, limit: int, inclusive: bool = False
             ) -> list[StoredTask]:
        with self._lock:
            self._settle_remnants(partition, after, inclusive)
            rows = list(self._rows.get((partition, after.bucket), {}).values())
        rows.sort(key=lambda t: t.position)
        found = [t for t in rows if _past(t.position, after, inclusive)]
        return found[:limit]

    def _settle_remnants(self, partition: int, after: Cursor, inclusive: bool) -> None:
        remnants = self._remnants.get((partition, after.bucket), set())
        for key in [k for k in remnants if _past(
                Cursor(after.bucket, k.scheduled_ms, k.ordering_id, k.uniqueness_key), after, inclusive)]:
            self._apply(lifecycle.settled(self._status.get(key), partition, after.bucket, key, None,
                                          clock.now_ms()))

    def drop_bucket(self, partition: int, bucket: int) -> None:
        with self._lock:
            self._index.get(partition, set()).discard(bucket)

    def mark_released(self, task: StoredTask, attempt: int, lease_until_ms: int, now_ms: int) -> None:
        with self._lock:
            self._apply(lifecycle.released(task, attempt, lease_until_ms, now_ms))

    def mark_retry(self, task: StoredTask, attempts: int, not_before_ms: int, error: str | None,
                   now_ms: int) -> None:
        with self._lock:
            self._apply(lifecycle.retry_later(task, attempts, not_before_ms, error, now_ms))

    def finish(self, task: StoredTask, state: State, error: str | None, now_ms: int,
               keep_row: bool = False, run: RunTimes | None = None) -> None:
        with self._lock:
            current = self._status.get(task.key)
            self._apply(lifecycle.blocked(task, error, current, now_ms, run) if keep_row
                        else lifecycle.finished(task, state, error, current, now_ms, run))

    def record_outcome(self, partition: int, key: TaskKey, attempt: int, succeeded: bool,
                       error: str | None, now_ms: int, run: RunTimes | None = None,
                       generation: int = 0) -> None:
        with self._lock:
            self._apply(lifecycle.reported(key, attempt, succeeded, error, now_ms, run, generation))

    def acquire_lease(self, partition: int, owner: str, ttl_ms: int, now_ms: int) -> Lease | None:
        with self._lock:
            current = self._leases.get(partition)
            if current is not None and current.owner != owner and current.expires_ms > now_ms:
                return None
            lease = Lease(partition, owner, (current.epoch if current else 0) + 1, now_ms + ttl_ms)
            self._leases[partition] = lease
            return lease

    def renew_lease(self, lease: Lease, ttl_ms: int, now_ms: int) -> Lease | None:
        with self._lock:
            current = self._leases.get(lease.partition)
            if current is None or (current.owner, current.epoch) != (lease.owner, lease.epoch):
                return None
            renewed = replace(lease, expires_ms=now_ms + ttl_ms)
            self._leases[lease.partition] = renewed
            return renewed

    def release_lease(self, lease: Lease) -> None:
        with self._lock:
            current = self._leases.get(lease.partition)
            if current is not None and (current.owner, current.epoch) == (lease.owner, lease.epoch):
                self._leases[lease.partition] = replace(current, expires_ms=0)
