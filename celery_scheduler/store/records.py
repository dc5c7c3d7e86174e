"""The records the schedule store keeps and returns: a key's state and status, a stored task
and its place in the schedule, a partition lease, and the operations ingest applies.

Pending tasks live in rows keyed by (Kafka partition, time bucket) and clustered by
(time, ordering id, uniqueness key); a bucket index lists the buckets of a partition that
may hold rows. A row written for a time already past goes to the bucket of "now minus one"
instead of its own, and index entries are removed only for buckets at least two buckets
old, so a row is never written into a bucket that a dispatcher already dropped from the
index. A row's bucket is recorded in its status, so it can be found again.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple

from celery_scheduler.envelope import ScheduleEnvelope
from celery_scheduler.keys import TaskKey

__all__ = ["Cancel", "Cursor", "EntryChange", "Lease", "Operation", "OperatorAction", "Pause", "PauseScope",
           "Put", "RateLimit", "Reschedule", "Retry",
           "RunTimes", "State", "StoredTask", "TaskStatus", "bucket_of", "droppable", "settled_state",
           "write_bucket"]


class State(str, enum.Enum):
    """Lifecycle of a task key."""

    PENDING = "pending"
    RELEASED = "released"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    # not released by its deadline (its ``expires``): skipped, and its ordering id moved on
    EXPIRED = "expired"
    # moved to another time before it was released: the key its status keeps runs instead
    RESCHEDULED = "rescheduled"

    @property
    def finished(self) -> bool:
        """A finished (succeeded, failed or expired) key never runs again."""
        return self in (State.SUCCEEDED, State.FAILED, State.EXPIRED)


@dataclass(frozen=True)
class TaskStatus:
    """What the store knows about one task key."""

    key: TaskKey
    state: State
    task: str
    partition: int
    attempts: int = 0
    last_error: str | None = None
    updated_ms: int = 0
    bucket: int | None = None
    outcome: str | None = None  # "succeeded"/"failed", written by the worker
    outcome_attempt: int = 0  # which release the outcome belongs to
    # A finished task's times (epoch ms; 0 if unknown): its first release, and the start
    # and end of its last attempt on the worker.
    released_ms: int = 0
    started_ms: int = 0
    finished_ms: int = 0
    # which of its attempt's releases the outcome came from (their start lease's end; 0:
    # unknown, as from workers of earlier versions)
    outcome_generation: int = 0


class RunTimes(NamedTuple):
    """When a task was first released, and its last attempt started and ended (epoch ms, 0:
    unknown): what a finished task's status records for the lateness reports."""

    released_ms: int = 0
    started_ms: int = 0
    finished_ms: int = 0


@dataclass(frozen=True)
class StoredTask:
    """A pending task as stored, with its dispatch state."""

    partition: int
    bucket: int
    envelope: ScheduleEnvelope
    attempts: int = 0
    not_before_ms: int = 0
    lease_until_ms: int = 0
    blocked: bool = False

    @property
    def key(self) -> TaskKey:
        return self.envelope.key

    @property
    def position(self) -> Cursor:
        key = self.envelope.key
        return Cursor(self.bucket, key.scheduled_ms, key.ordering_id, key.uniqueness_key)


@dataclass(frozen=True, order=True)
class Cursor:
    """A position in a partition's schedule: rows are read in (bucket, at, ids) order."""

    bucket: int
    at_ms: int = -1
    ordering_id: str = ""
    uniqueness_key: str = ""


@dataclass(frozen=True)
class Lease:
    """Ownership of a partition: only the holder of the newest epoch may release from it."""

    partition: int
    owner: str
    epoch: int
    expires_ms: int


@dataclass(frozen=True)
class EntryChange:
    """What was changed at run time of periodic entry *name* (see
    :mod:`celery_scheduler.periodic_admin`); it wins over the app's ``beat_schedule``."""

    name: str
    paused: bool = False  # fires nothing until resumed
    deleted: bool = False  # fires nothing, whatever beat_schedule says, until reset
    definition: str | None = None  # the entry as JSON, added or replacing beat_schedule's
    resumed_ms: int = 0  # when it was last resumed: no occurrence before fires
    updated_ms: int = 0


class PauseScope(str, enum.Enum):
    """What one pause holds back: the tasks of one name, one ordering id, or everything."""

    TASK = "task"
    ORDERING_ID = "ordering_id"
    ALL = "all"


@dataclass(frozen=True)
class Pause:
    """An operator's pause (see :mod:`celery_scheduler.pauses`): while it is kept, nothing it
    holds is released. *value* is the task name or the ordering id ("" for everything)."""

    scope: PauseScope
    value: str
    paused_ms: int
    by: str = ""  # who paused it, as the operator's tool names them
    reason: str = ""

    @property
    def label(self) -> str:
        return "everything" if self.scope is PauseScope.ALL else f"{self.scope.value} {self.value!r}"


@dataclass(frozen=True)
class RateLimit:
    """An operator's rate limit (see :mod:`celery_scheduler.rate_limits`): the releases of a
    task name (across every dispatcher) or of one ordering id, at most *per_second*."""

    scope: PauseScope  # TASK or ORDERING_ID
    value: str
    per_second: float
    set_ms: int
    by: str = ""

    @property
    def label(self) -> str:
        return f"{self.scope.value} {self.value!r}"


@dataclass(frozen=True)
class OperatorAction:
    """One line of the operators' log (see :mod:`celery_scheduler.audit`): who did what,
    to what, when."""

    at_ms: int
    actor: str  # who, as their tool names them (user@host, "HTTP API from ...", "console")
    action: str  # "pause", "resume", "cancel", "cancel-many", "retry", "periodic pause", ...
    target: str  # what it acted on: a key, an ordering id, a task name, an entry, a selection
    detail: str = ""  # its reason, or what it came to


@dataclass(frozen=True)
class Put:
    """Store *envelope* as pending in *partition* (see :meth:`ScheduleStore.put`)."""

    partition: int
    envelope: ScheduleEnvelope
    # the envelope's bytes as read from the task log, stored as they are (not encoded again)
    data: bytes | None = field(default=None, compare=False, repr=False)

    @property
    def key(self) -> TaskKey:
        return self.envelope.key


@dataclass(frozen=True)
class Cancel:
    """Cancel the pending *key* (see :meth:`ScheduleStore.cancel`)."""

    partition: int
    key: TaskKey


@dataclass(frozen=True)
class Retry:
    """Run the failed *key* once more (see :meth:`ScheduleStore.retry`)."""

    partition: int
    key: TaskKey


@dataclass(frozen=True)
class Reschedule:
    """Move the pending *key* to *envelope*'s key, a later or earlier time of its ordering id
    (see :meth:`ScheduleStore.reschedule`)."""

    partition: int
    key: TaskKey
    envelope: ScheduleEnvelope
    data: bytes | None = field(default=None, compare=False, repr=False)


Operation = Put | Cancel | Retry | Reschedule


def bucket_of(scheduled_ms: int, bucket_seconds: int) -> int:
    """The time bucket a scheduled time falls in (buckets are *bucket_seconds* wide)."""
    return scheduled_ms // (bucket_seconds * 1000)


def write_bucket(scheduled_ms: int, now_ms: int, bucket_seconds: int) -> int:
    """The bucket a row is written to: its own, or "now minus one" if that one is older."""
    return max(bucket_of(scheduled_ms, bucket_seconds), bucket_of(now_ms, bucket_seconds) - 1)


def settled_state(status: TaskStatus | None, partition: int, bucket: int) -> State | None:
    """The final state to record for a key whose row at (*partition*, *bucket*) lost its task.

    Only a cancel or a completion deletes a row. A dispatch update (a release marking, a
    retry) written just after one of them re-creates the row without its task and
    overwrites the final status with "released" or "pending": a dispatcher that marked a
    task released a moment after its cancel was applied, then died before publishing it.
    Nobody will run that task (there is nothing left to run), so its status must say so:
    "succeeded" if a worker reported so, "cancelled" otherwise. None: the status is final
    already, unknown, or belongs to a row elsewhere, and only the remnant goes.
    """
    if status is None or status.partition != partition or status.bucket != bucket:
        return None
    if status.state not in (State.PENDING, State.RELEASED):
        return None
    return State.SUCCEEDED if status.outcome == "succeeded" else State.CANCELLED


def droppable(bucket: int, now_ms: int, bucket_seconds: int) -> bool:
    """Whether an empty bucket may leave the index: no writer will use it again."""
    return bucket < bucket_of(now_ms, bucket_seconds) - 2
