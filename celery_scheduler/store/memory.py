"""An in-process schedule store for unit tests and the testing helper."""

from __future__ import annotations

import threading
from dataclasses import replace

from celery_scheduler.envelope import ScheduleEnvelope
from celery_scheduler.keys import TaskKey
from celery_scheduler.store.base import (
    Cursor,
    Lease,
    RunTimes,
    ScheduleStore,
    State,
    StoredTask,
    TaskStatus,
    settled_state,
    write_bucket,
)
from celery_scheduler.store.lifecycle import may_cancel, may_retry, plan_put

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
        self._lock = threading.Lock()

    def create_schema(self, status_shards: int | None = None) -> int:
        return 0

    def drop_schema(self) -> bool:
        with self._lock:
            held = bool(self._rows or self._status or self._leases)
            for table in (self._rows, self._index, self._status, self._leases, self._remnants,
                          self._kept):
                table.clear()
        return held

    def _set_row(self, task: StoredTask) -> None:
        self._rows.setdefault((task.partition, task.bucket), {})[task.key] = task
        self._index.setdefault(task.partition, set()).add(task.bucket)
        self._remnants.get((task.partition, task.bucket), set()).discard(task.key)

    def _delete_row(self, partition: int, bucket: int | None, key: TaskKey) -> None:
        if bucket is not None:
            self._rows.get((partition, bucket), {}).pop(key, None)
            self._remnants.get((partition, bucket), set()).discard(key)

    def _update_row(self, task: StoredTask, **changes: object) -> None:
        row = self._rows.get((task.partition, task.bucket), {}).get(task.key)
        if row is None:
            self._remnants.setdefault((task.partition, task.bucket), set()).add(task.key)
        else:
            self._set_row(replace(row, **changes))  # type: ignore[arg-type]

    def put(self, partition: int, envelope: ScheduleEnvelope, now_ms: int) -> StoredTask | None:
        key = envelope.key
        with self._lock:
            plan = plan_put(partition, key, self._status.get(key), now_ms, self.bucket_seconds)
            if plan is None:
                return None
            if plan.moved_from is not None:
                self._delete_row(*plan.moved_from, key)
            bucket = plan.bucket
            task = StoredTask(partition, bucket, envelope)
            self._set_row(task)
            self._status[key] = TaskStatus(key, State.PENDING, envelope.task, partition, 0, None,
                                           now_ms, bucket)
            return task

    def cancel(self, partition: int, key: TaskKey, now_ms: int) -> bool:
        with self._lock:
            current = self._status.get(key)
            if not may_cancel(current):
                return False
            assert current is not None
            row = self._rows.get((current.partition, current.bucket or 0), {}).get(key)
            if current.state is State.FAILED and row is None:
                return False  # failed and gone: nothing to cancel
            self._delete_row(current.partition, current.bucket, key)
            self._status[key] = replace(current, state=State.CANCELLED, updated_ms=now_ms,
                                        released_ms=0, started_ms=0, finished_ms=0)
            return True

    def retry(self, partition: int, key: TaskKey, now_ms: int) -> StoredTask | None:
        with self._lock:
            current = self._status.get(key)
            if not may_retry(current):
                return None
            assert current is not None
            row = self._rows.get((current.partition, current.bucket or 0), {}).get(key)
            if row is not None:  # blocked: its row is kept
                task = replace(row, not_before_ms=0, lease_until_ms=0, blocked=False)
            elif key in self._kept:
                bucket = write_bucket(key.scheduled_ms, now_ms, self.bucket_seconds)
                task = StoredTask(partition, bucket, self._kept[key], attempts=current.attempts)
            else:
                return None
            self._kept.pop(key, None)
            self._set_row(task)
            self._status[key] = replace(current, state=State.PENDING, partition=task.partition,
                                        bucket=task.bucket, updated_ms=now_ms)
            return task

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
            remnants.discard(key)
            current = self._status.get(key)
            state = settled_state(current, partition, after.bucket)
            if current is not None and state is not None:
                self._status[key] = replace(current, state=state)

    def drop_bucket(self, partition: int, bucket: int) -> None:
        with self._lock:
            self._index.get(partition, set()).discard(bucket)

    def _update_status(self, key: TaskKey, **changes: object) -> None:
        current = self._status.get(key)
        if current is not None:
            self._status[key] = replace(current, **changes)  # type: ignore[arg-type]

    def mark_released(self, task: StoredTask, attempt: int, lease_until_ms: int, now_ms: int) -> None:
        with self._lock:
            self._update_row(task, attempts=attempt, lease_until_ms=lease_until_ms)
            self._update_status(task.key, state=State.RELEASED, attempts=attempt, updated_ms=now_ms)

    def mark_retry(self, task: StoredTask, attempts: int, not_before_ms: int, error: str | None,
                   now_ms: int) -> None:
        with self._lock:
            self._update_row(task, attempts=attempts, not_before_ms=not_before_ms, lease_until_ms=0)
            self._update_status(task.key, state=State.PENDING, attempts=attempts, last_error=error,
                                updated_ms=now_ms)

    def finish(self, task: StoredTask, state: State, error: str | None, now_ms: int,
               keep_row: bool = False, run: RunTimes | None = None) -> None:
        with self._lock:
            if keep_row:
                self._update_row(task, blocked=True, lease_until_ms=0)
            else:
                self._delete_row(task.partition, task.bucket, task.key)
                if state is State.FAILED:
                    self._kept[task.key] = task.envelope
            released, started, finished = run or RunTimes()
            changes: dict[str, object] = {"state": state, "updated_ms": now_ms, "released_ms": released,
                                          "started_ms": started, "finished_ms": finished}
            if error is not None:
                changes["last_error"] = error
            self._update_status(task.key, **changes)

    def record_outcome(self, partition: int, key: TaskKey, attempt: int, succeeded: bool,
                       error: str | None, now_ms: int, run: RunTimes | None = None,
                       generation: int = 0) -> None:
        with self._lock:
            changes: dict[str, object] = {
                "outcome": "succeeded" if succeeded else "failed", "outcome_attempt": attempt,
                "outcome_generation": generation,
                "updated_ms": now_ms, "started_ms": (run or RunTimes()).started_ms,
                "finished_ms": (run or RunTimes()).finished_ms}
            if succeeded:
                changes["state"] = State.SUCCEEDED
            else:
                changes["last_error"] = error
            self._update_status(key, **changes)

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
