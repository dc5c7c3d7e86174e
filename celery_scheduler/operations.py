"""What an operator looks at and repairs: partitions, one task key, dead letters.

Read-only views of the store and the Kafka topics behind ``celery -A proj scheduler status``,
``inspect`` and ``dead-letters``. The two writes go through the scheduler topic like every
change to the schedule, for the dispatchers to apply: a dead-letter replay produces the
records again, through the same partitioner as a schedule call (the task key makes a replay
idempotent), and a retry produces a retry record for a failed key.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from celery_scheduler.audit import about, note, said
from celery_scheduler.client import SchedulerClient
from celery_scheduler.config import Settings
from celery_scheduler.decoding import decode
from celery_scheduler.envelope import CancelEnvelope, RetryEnvelope, ScheduleEnvelope
from celery_scheduler.errors import EnvelopeDecodeError, NotRetryableError
from celery_scheduler.keys import TaskKey, from_epoch_ms
from celery_scheduler.partitioner import partition_for
from celery_scheduler.store.base import Cursor, ScheduleStore, State, StoredTask, bucket_of
from celery_scheduler.tasklog import views
from celery_scheduler.tasklog.views import consumer_lag

__all__ = ["LISTED_STATES", "DeadLetter", "DueSoon", "PartitionView", "consumer_lag", "describe_key",
           "due_soon",
           "ordering_id_tasks", "partitions", "read_dead_letters", "replay", "request_retry",
           "retry_problem", "tasks_in_state", "waiting_note"]

# How much of an argument list an operator sees.
SHOWN_CHARACTERS = 300


def _iso(ms: int | None) -> str | None:
    return None if not ms else from_epoch_ms(ms).isoformat()


@dataclass(frozen=True)
class PartitionView:
    """One partition of the scheduler topic, as the store and Kafka see it."""

    partition: int
    owner: str | None  # the dispatcher holding the lease, None if nobody ever did
    epoch: int
    lease_expires: str | None  # ISO 8601; in the past when nobody holds it now
    leased: bool
    pending: int  # rows in the schedule: pending, released or waiting for a retry
    oldest: str | None  # earliest scheduled time among them
    overdue_seconds: float  # how long the oldest has been due (0 if none is)
    lag: int | None  # records not yet read by the dispatchers (None: unknown)


def partitions(count: int, store: ScheduleStore, now_ms: int,
               lags: dict[int, int | None] | None = None) -> list[PartitionView]:
    """The *count* partitions of the topic: owner, lease, backlog, and consumer lag (if given)."""
    leases = {lease.partition: lease for lease in store.leases()}
    views = []
    for number in range(count):
        lease = leases.get(number)
        pending, oldest = store.backlog(number)
        views.append(PartitionView(
            number, lease.owner if lease else None, lease.epoch if lease else 0,
            _iso(lease.expires_ms) if lease else None,
            lease is not None and lease.expires_ms > now_ms, pending, _iso(oldest),
            max(0.0, (now_ms - oldest) / 1000) if oldest is not None else 0.0,
            (lags or {}).get(number)))
    return views


@dataclass(frozen=True)
class DueSoon:
    """What falls due next, over all partitions, per bucket of the schedule (a minute by default)."""

    bucket_seconds: int
    overdue: int  # rows in buckets that ended before now: due, and not finished
    buckets: list[tuple[str, int]]  # (start of the bucket, ISO 8601; rows), from now's on


def due_soon(count: int, store: ScheduleStore, now_ms: int, buckets: int = 30) -> DueSoon:
    """Rows per bucket of the next *buckets* buckets of the *count* partitions, and overdue."""
    size = store.bucket_seconds
    current = bucket_of(now_ms, size)
    per_bucket = dict.fromkeys(range(current, current + buckets), 0)
    overdue = 0
    for number in range(count):
        for bucket, rows in store.bucket_sizes(number, 0, current + buckets - 1).items():
            if bucket < current:
                overdue += rows
            else:
                per_bucket[bucket] += rows
    return DueSoon(size, overdue, [(from_epoch_ms(bucket * size * 1000).isoformat(), rows)
                                   for bucket, rows in sorted(per_bucket.items())])


def describe_key(store: ScheduleStore, key: TaskKey, now_ms: int | None = None
                 ) -> dict[str, Any] | None:
    """Everything the store knows of *key*: status, attempts, error, its task if stored,
    where a reschedule moved it, and (given *now_ms*) the operators' actions on it."""
    status = store.status(key)
    if status is None:
        return None
    row = store.task(key)
    moved = store.kept_envelope(key) if status.state is State.RESCHEDULED else None
    described: dict[str, Any] = {
        "key": {"ordering_id": key.ordering_id, "at": key.scheduled_at.isoformat(),
                "unique": key.uniqueness_key},
        "task_id": key.task_id, "state": status.state.value, "task": status.task,
        "partition": status.partition, "attempts": status.attempts,
        "last_error": status.last_error, "updated": _iso(status.updated_ms),
        "outcome": status.outcome, "outcome_attempt": status.outcome_attempt or None,
        # a finished task's first release, and its last attempt's start and end on the worker
        "released": _iso(status.released_ms), "started": _iso(status.started_ms),
        "ended": _iso(status.finished_ms),
        "moved_to": str(moved.key) if moved is not None else None,
    }
    if row is not None:
        envelope = row.envelope
        described["task_id"] = envelope.task_id
        described.update({
            "args": _shown(envelope.args), "kwargs": _shown(envelope.kwargs),
            "options": envelope.options, "retry": envelope.retry.as_json(),
            "enqueued": _iso(envelope.enqueued_ms), "not_before": _iso(row.not_before_ms),
            "lease_until": _iso(row.lease_until_ms), "blocked": row.blocked,
        })
    if now_ms is not None:
        lines = about(store, key, status.task, now_ms)
        described["operator_actions"] = [said(line) for line in lines] or None
    return described


def retry_problem(store: ScheduleStore, key: TaskKey) -> str | None:
    """Why *key* cannot be retried, or None if it can (it failed, and its task was kept)."""
    status = store.status(key)
    if status is None:
        return (f"{key} is unknown (never stored, or its status expired after "
                "scheduler_status_ttl): schedule it again")
    if status.state is not State.FAILED:
        what = {State.PENDING: "it is pending and runs when due",
                State.RELEASED: "it is running (released to Celery)",
                State.SUCCEEDED: "it succeeded, and a finished key never runs again",
                State.CANCELLED: "it was cancelled, and a cancel is final",
                State.EXPIRED: "it expired (it could not be released by its expires= deadline), "
                               "and an expired key never runs"}[status.state]
        return f"{key} is not failed: {what}"
    if store.task(key) is None and store.kept_envelope(key) is None:
        return (f"{key} failed before its task was kept for a retry (a dispatcher older than "
                "retries failed it): schedule it again under a new uniqueness key")
    return None


def request_retry(client: SchedulerClient, key: TaskKey, by: str | None = None) -> None:
    """Ask the dispatchers to run the failed *key* once more; NotRetryableError if it cannot.

    The check reads the store; the retry itself is a record on the scheduler topic, applied
    by the dispatcher that owns the key's partition (see :meth:`ScheduleStore.retry`). A
    blocked key's ordering id moves on once the retried attempt succeeds. The operators' log
    notes it, by *by*.
    """
    problem = retry_problem(client.store, key)
    if problem is not None:
        raise NotRetryableError(problem)
    client.publish(RetryEnvelope(key, client.clock()))
    note(client, "retry", str(key), by=by)


def request_cancel(client: SchedulerClient, key: TaskKey, by: str | None = None) -> None:
    """An operator's cancel of *key* (it still runs if already released), noted in the
    operators' log."""
    client.publish(CancelEnvelope(key, client.clock()))
    note(client, "cancel", str(key), by=by)


def ordering_id_tasks(store: ScheduleStore, partitions: int, ordering_id: str,
                      limit: int = 1000) -> list[dict[str, Any]]:
    """The tasks of *ordering_id* still in the schedule, in the order they will run."""
    rows = store.rows_of(partition_for(ordering_id, partitions), ordering_id, limit)
    statuses = store.statuses([row.key for row in rows])
    return [{"at": row.key.scheduled_at.isoformat(), "unique": row.key.uniqueness_key,
             "task_id": row.envelope.task_id, "task": row.envelope.task,
             "state": status.state.value if status else "?",
             "attempts": row.attempts, "not_before": _iso(row.not_before_ms),
             "lease_until": _iso(row.lease_until_ms), "blocked": row.blocked,
             "last_error": status.last_error if status else None}
            for row, status in zip(rows, statuses, strict=True)]


# What `list --state` finds: failed keys (from the status table), and the schedule's rows
# blocked after their last attempt or released and not finished yet.
LISTED_STATES = ("failed", "blocked", "released")
PAGE = 500


def _schedule_rows(store: ScheduleStore, partition: int) -> Iterator[StoredTask]:
    """Every row of *partition*'s schedule, oldest first, a page at a time."""
    for bucket in store.buckets(partition, 0, 2**62, limit=1_000_000):
        cursor, inclusive = Cursor(bucket), False
        while True:
            rows = store.read(partition, cursor, PAGE, inclusive)
            yield from rows
            if len(rows) < PAGE:
                break
            cursor, inclusive = rows[-1].position, False


def _listed(key: TaskKey, task: str, state: str, attempts: int, last_error: str | None,
            note: str) -> dict[str, Any]:
    return {"ordering_id": key.ordering_id, "at": key.scheduled_at.isoformat(),
            "unique": key.uniqueness_key, "task": task, "state": state, "attempts": attempts,
            "last_error": last_error, "note": note}


def tasks_in_state(store: ScheduleStore, partitions: int, state: str, limit: int = 100
                   ) -> list[dict[str, Any]]:
    """Up to *limit* tasks that are failed, blocked or released (see :data:`LISTED_STATES`).

    Failed keys come from a scan of the status table; blocked and released ones from a walk
    of every partition's schedule, oldest first. Both read much of the store: for operators,
    not for a program's hot path.
    """
    if state not in LISTED_STATES:
        raise ValueError(f"state must be one of {', '.join(LISTED_STATES)}, got {state!r}")
    if state == "failed":
        found = []
        for status in store.statuses_in_state(State.FAILED, limit):
            row = store.task(status.key)
            found.append(_listed(status.key, status.task, "failed", status.attempts, status.last_error,
                                 "blocked: holds its ordering id" if row is not None and row.blocked
                                 else f"failed at {_iso(status.updated_ms)}"))
        return sorted(found, key=lambda task: task["at"])
    rows: list[StoredTask] = []
    for partition in range(partitions):
        matching = 0
        for row in _schedule_rows(store, partition):
            if row.blocked if state == "blocked" else (row.lease_until_ms > 0 and not row.blocked):
                rows.append(row)
                matching += 1
                if matching >= limit:
                    break
    rows.sort(key=lambda row: row.position)
    statuses = store.statuses([row.key for row in rows[:limit]])
    return [_listed(row.key, row.envelope.task, state, row.attempts,
                    status.last_error if status else None,
                    "blocked: holds its ordering id" if row.blocked
                    else f"lease until {_iso(row.lease_until_ms)}")
            for row, status in zip(rows[:limit], statuses, strict=True)]


def waiting_note(task: dict[str, Any]) -> str:
    """Why a task of :func:`ordering_id_tasks` waits: blocked, a retry's time, or a lease."""
    if task["blocked"]:
        return "blocked"
    if task["not_before"]:
        return f"retry after {task['not_before']}"
    return f"lease until {task['lease_until']}" if task["lease_until"] else ""


def _shown(value: Any) -> str:
    """Arguments as an operator sees them: JSON, cut short (they may be large or private)."""
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= SHOWN_CHARACTERS else text[:SHOWN_CHARACTERS - 3] + "..."


@dataclass(frozen=True)
class DeadLetter:
    """A record a dispatcher refused, with why and where it came from."""

    offset: int
    reason: str
    source: str  # topic/partition/offset it was read from
    key: bytes | None
    value: bytes | None
    task: str | None  # the task it names, if the record decodes

    def as_json(self) -> dict[str, Any]:
        shown = asdict(self)
        shown["key"] = None if self.key is None else self.key.decode("utf-8", "replace")
        shown["value"] = None if self.value is None else _cut(self.value.decode("utf-8", "replace"))
        return shown


def _cut(text: str) -> str:
    return text if len(text) <= SHOWN_CHARACTERS else text[:SHOWN_CHARACTERS - 3] + "..."


def read_dead_letters(settings: Settings, reason: str | None = None,
                      timeout: float = 10.0) -> Iterator[DeadLetter]:
    """The dead letters from the oldest kept to the newest, those whose reason holds *reason*."""
    for letter in views.dead_letters(settings, timeout):
        shown = _letter(letter)
        if reason is None or reason in shown.reason:
            yield shown


def _letter(letter: views.Letter) -> DeadLetter:
    task = None
    if letter.value is not None:
        try:
            envelope = decode(letter.value)
            task = envelope.task if isinstance(envelope, ScheduleEnvelope) else None
        except EnvelopeDecodeError:
            pass
    return DeadLetter(letter.offset, letter.headers.get("reason", ""), letter.headers.get("source", ""),
                      letter.key, letter.value, task)


def replay(publish: Callable[[str, bytes], Any], letters: Iterator[DeadLetter]) -> tuple[int, int]:
    """Produce *letters* to the scheduler topic again; return (replayed, skipped).

    *publish* is the schedule call's own path (``SchedulerClient.publish_record``): the same
    partitioner, acknowledgements and signature as a new call. A letter without a key or a
    value cannot be a task, and is skipped.
    """
    replayed = skipped = 0
    for letter in letters:
        if letter.key is None or letter.value is None:
            skipped += 1
            continue
        publish(letter.key.decode("utf-8", "replace"), letter.value)
        replayed += 1
    return replayed, skipped
