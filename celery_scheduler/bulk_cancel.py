"""Cancel many pending tasks at once: every key of an ordering id, of a task name, due in a
span, or any mix of those, with a dry run that says how many and which.

A bulk cancel is many single cancels: the keys are found in the schedule a page at a time,
and a cancel record of each pending one goes to Kafka, where the dispatcher that owns its
partition applies it as it applies any other. So it is final and ordered the same way: a
cancel acknowledged by Kafka before the dispatcher marked the key released stops it. A key
already released (running, or sent to the workers) is not cancelled and is reported apart,
never counted as cancelled; :func:`settle` reads back, once the dispatchers have applied the
cancels, how many ended cancelled and how many were released first.

Memory stays bounded by the page: a selection of millions of keys is walked, not held, and
the report keeps counts and the first keys of each kind as examples.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from celery_scheduler.audit import note
from celery_scheduler.client import SchedulerClient
from celery_scheduler.envelope import CancelEnvelope
from celery_scheduler.errors import SelectionError
from celery_scheduler.keys import TaskKey, to_epoch_ms
from celery_scheduler.partitioner import partition_for
from celery_scheduler.store.base import ScheduleStore
from celery_scheduler.store.records import Cursor, State, StoredTask, TaskStatus, bucket_of

__all__ = ["BulkCancel", "Selection", "cancel_many", "settle", "sort_out"]

PAGE = 500
EXAMPLES = 20  # keys of each kind a report lists
FAR = 2**62


@dataclass(frozen=True)
class Selection:
    """The keys a bulk cancel takes: those that meet every criterion given.

    *due_from* (included) and *due_before* (excluded) bound the tasks' scheduled times; they
    must be timezone-aware. At least one criterion is required: a bulk cancel of everything
    is refused rather than guessed.
    """

    ordering_id: str | None = None
    task: str | None = None
    due_from: dt.datetime | None = None
    due_before: dt.datetime | None = None

    def __post_init__(self) -> None:
        if not any(value is not None and value != "" for value in dataclasses.astuple(self)):
            raise SelectionError("a bulk cancel needs at least one of ordering_id, task, due_from "
                                 "and due_before; to cancel one key, cancel its handle")
        for name in ("due_from", "due_before"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, dt.datetime) or value.tzinfo is None):
                raise SelectionError(f"{name} must be a timezone-aware datetime, got {value!r}; "
                                     "give the zone (e.g. datetime.timezone.utc)")
        if self.due_from is not None and self.due_before is not None and (
                self.due_from >= self.due_before):
            raise SelectionError(f"due_from {self.due_from.isoformat()} is not before due_before "
                                 f"{self.due_before.isoformat()}: the span is empty")

    @property
    def from_ms(self) -> int:
        return 0 if self.due_from is None else to_epoch_ms(self.due_from, dt.timezone.utc)

    @property
    def before_ms(self) -> int:
        return FAR if self.due_before is None else to_epoch_ms(self.due_before, dt.timezone.utc)

    def holds(self, row: StoredTask) -> bool:
        key = row.key
        return ((self.ordering_id is None or key.ordering_id == self.ordering_id)
                and (self.task is None or row.envelope.task == self.task)
                and self.from_ms <= key.scheduled_ms < self.before_ms)

    def describe(self) -> str:
        said = [f"ordering id {self.ordering_id!r}" if self.ordering_id is not None else "",
                f"task {self.task!r}" if self.task is not None else "",
                f"due from {self.due_from.isoformat()}" if self.due_from is not None else "",
                f"due before {self.due_before.isoformat()}" if self.due_before is not None else ""]
        return ", ".join(part for part in said if part)


@dataclass
class BulkCancel:
    """What a bulk cancel found and did (or, in a dry run, would do).

    ``requested``: pending keys whose cancel went to Kafka (a dry run: would go);
    ``released``: keys already released to the workers, left alone (a cancel cannot stop a
    task that is running); ``already_cancelled``: keys cancelled before. After
    :func:`settle`: ``cancelled`` ended cancelled, ``released_first`` were released before
    their cancel was applied, ``unsettled`` had neither happened by the timeout.
    """

    selection: Selection
    dry_run: bool
    requested: int = 0
    released: int = 0
    already_cancelled: int = 0
    examples: dict[str, list[TaskKey]] = field(default_factory=dict)
    cancelled: int | None = None
    released_first: int | None = None
    unsettled: int | None = None
    keys: list[TaskKey] | None = None  # every key requested, when kept (for settle)

    @property
    def matched(self) -> int:
        return self.requested + self.released + self.already_cancelled

    def note(self, kind: str, keys: Sequence[TaskKey]) -> None:
        listed = self.examples.setdefault(kind, [])
        listed.extend(keys[:max(0, EXAMPLES - len(listed))])

    def summary(self) -> str:
        verb = "would be cancelled" if self.dry_run else "cancel requested"
        text = (f"{self.matched} key(s) match {self.selection.describe()}: {self.requested} "
                f"pending, {verb}; {self.released} already released (running or sent to the "
                f"workers), left to run; {self.already_cancelled} cancelled before")
        if self.cancelled is not None:
            text += (f". Applied: {self.cancelled} cancelled, {self.released_first} released "
                     f"before their cancel was read, {self.unsettled} not settled yet")
        return text

    def as_json(self) -> dict[str, object]:
        return {"selection": self.selection.describe(), "dry_run": self.dry_run,
                "matched": self.matched, "requested": self.requested, "released": self.released,
                "already_cancelled": self.already_cancelled, "cancelled": self.cancelled,
                "released_first": self.released_first, "unsettled": self.unsettled,
                "examples": {kind: [str(key) for key in keys]
                             for kind, keys in self.examples.items()}}


@dataclass(frozen=True)
class Sorted:
    """One page of matching rows, by what a cancel can do to them."""

    pending: list[TaskKey]
    released: list[TaskKey]
    cancelled: list[TaskKey]


def sort_out(rows: Sequence[StoredTask], statuses: Sequence[TaskStatus | None]) -> Sorted:
    """Pure: *rows* (matching a selection) with their *statuses*: pending keys to cancel (and
    blocked ones, failed and holding their ordering id), released ones to leave, cancelled
    ones already done. A row marked released (its lease set) counts as released even if its
    status lags."""
    pending: list[TaskKey] = []
    released: list[TaskKey] = []
    cancelled: list[TaskKey] = []
    for row, status in zip(rows, statuses, strict=True):
        state = status.state if status is not None else State.PENDING
        if state is State.CANCELLED:
            cancelled.append(row.key)
        elif state is State.FAILED and row.blocked:
            pending.append(row.key)  # failed and holding its ordering id: a cancel frees it
        elif row.lease_until_ms > 0 or state is not State.PENDING:
            released.append(row.key)
        else:
            pending.append(row.key)
    return Sorted(pending, released, cancelled)


def _pages(store: ScheduleStore, partitions: int, selection: Selection, page: int
           ) -> Iterator[list[StoredTask]]:
    """The rows that match *selection*, a page at a time, partition by partition."""
    if selection.ordering_id is not None:  # one partition, filtered by the store
        rows = [row for row in store.rows_of(partition_for(selection.ordering_id, partitions),
                                             selection.ordering_id, limit=FAR)
                if selection.holds(row)]
        for start in range(0, len(rows), page):
            yield rows[start:start + page]
        return
    first = 0 if selection.due_from is None else bucket_of(selection.from_ms, store.bucket_seconds)
    last = FAR if selection.due_before is None else bucket_of(selection.before_ms, store.bucket_seconds)
    for partition in range(partitions):
        for bucket in store.buckets(partition, first, last, limit=1_000_000):
            cursor, inclusive = Cursor(bucket), False
            while True:
                rows = store.read(partition, cursor, page, inclusive)
                matching = [row for row in rows if selection.holds(row)]
                if matching:
                    yield matching
                if len(rows) < page:
                    break
                cursor = rows[-1].position


def cancel_many(client: SchedulerClient, selection: Selection, *, dry_run: bool = False,
                keep_keys: bool = False, page: int = PAGE,
                progress: Callable[[BulkCancel], None] | None = None,
                by: str | None = None) -> BulkCancel:
    """Cancel every pending key *selection* matches (a dry run only counts them).

    *keep_keys* keeps every key requested in the report, for :func:`settle` (about 200 bytes
    a key); without it the report keeps counts and examples only.

    The cancels of each page go to Kafka together and are waited for before the next page is
    read; *progress* is called after each page with the report so far. Raises
    :class:`~celery_scheduler.errors.TaskLogUnavailableError` if Kafka did not take a page:
    the keys whose cancel was acknowledged are counted in nothing then, and running the same
    bulk cancel again is safe (a cancelled key is found cancelled). The operators' log notes
    a bulk cancel (not a dry run) once done, by *by*.
    """
    report = BulkCancel(selection, dry_run, keys=[] if keep_keys else None)
    store, partitions = client.store, client.task_log.partitions()
    for rows in _pages(store, partitions, selection, page):
        found = sort_out(rows, store.statuses([row.key for row in rows]))
        if found.pending and not dry_run:
            now = client.clock()
            client.publish_many([(key.ordering_id, client.encode(CancelEnvelope(key, now)))
                                 for key in found.pending]).wait(client.settings.kafka_produce_timeout)
        report.requested += len(found.pending)
        if report.keys is not None:
            report.keys.extend(found.pending)
        report.released += len(found.released)
        report.already_cancelled += len(found.cancelled)
        report.note("requested", found.pending)
        report.note("released", found.released)
        if progress is not None:
            progress(report)
    if not dry_run:
        note(client, "cancel-many", selection.describe(),
             f"{report.requested} cancel(s) requested, {report.released} released already left "
             "to run", by=by)
    return report


def settle(client: SchedulerClient, report: BulkCancel, timeout: float, every: float = 0.5
           ) -> BulkCancel:
    """Wait up to *timeout* seconds for the dispatchers to apply the cancels of *report*
    (made with ``keep_keys``), then count how the keys ended: cancelled, or released before
    their cancel was read."""
    if report.dry_run:
        return report
    if report.keys is None:
        raise ValueError("settle needs the keys requested: run cancel_many with keep_keys=True")
    requested = report.keys
    deadline = time.monotonic() + timeout
    while True:
        states = [status.state if status is not None else State.PENDING
                  for start in range(0, len(requested), PAGE)
                  for status in client.store.statuses(requested[start:start + PAGE])]
        waiting = sum(state is State.PENDING for state in states)
        if waiting == 0 or time.monotonic() >= deadline:
            break
        time.sleep(every)
    report.cancelled = sum(state is State.CANCELLED for state in states)
    report.released_first = len(states) - report.cancelled - waiting
    report.unsettled = waiting
    return report
