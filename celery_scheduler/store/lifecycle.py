"""Every transition of a task key, decided once for both stores (Cassandra and memory): the
functions here turn an event into a :class:`~celery_scheduler.store.transitions.Transition`
by the table of :mod:`~celery_scheduler.store.transitions` (its names are importable from
here too). They are pure: a store reads what they need (the key's status, its row), calls
one, and writes the result.

Some events are decided here from the key's status (schedule, cancel, retry, settle): a
schedule record read again (after a failed batch or a rebalance) or sent again never
undoes a later step, so it rewrites a key only while it is pending and never released. The
others (release, retry later, succeed, give up, block, report) come from the dispatcher
that holds the key's partition, which knows its state; a store writes them without reading
it (Cassandra's writes are blind), and the table documents what they assume.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from celery_scheduler.envelope import ScheduleEnvelope
from celery_scheduler.keys import TaskKey
from celery_scheduler.store.records import (
    RunTimes,
    State,
    StoredTask,
    TaskStatus,
    settled_state,
    write_bucket,
)
from celery_scheduler.store.transitions import (
    FINAL,
    TRANSITIONS,
    Event,
    Expiry,
    Pairs,
    RowKind,
    RowWrite,
    Transition,
    next_state,
    row_update,
    transition_of,
)

__all__ = ["FINAL", "TRANSITIONS", "Event", "Expiry", "PutPlan", "RowKind", "RowWrite", "Transition",
           "blocked", "cancelled", "finished", "may_cancel", "may_retry", "next_state",
           "plan_put", "released", "reported", "reschedule_problem", "rescheduled", "retried",
           "retry_later", "scheduled", "settled"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PutPlan:
    """Where a put writes its row, and the row of the key it replaces elsewhere, if any."""

    bucket: int
    moved_from: tuple[int, int] | None = None  # (partition, bucket) to delete


def _kept(key: TaskKey, current: TaskStatus) -> bool:
    """Whether *current* says *key* must not be written again (and log why)."""
    if current.state.finished:
        logger.info("not scheduling %s again: it already %s", key, current.state.value)
    elif current.state is State.RELEASED:
        logger.info("not rescheduling %s: it is running", key)
    elif current.state in (State.CANCELLED, State.RESCHEDULED):
        # A schedule record read again after its cancel (or its move) must not bring the
        # task back.
        logger.info("not scheduling %s again: it was %s", key, current.state.value)
    elif current.attempts > 0:
        logger.info("not rescheduling %s: it waits for attempt %d", key, current.attempts + 1)
    else:
        return False
    return True


def plan_put(partition: int, key: TaskKey, current: TaskStatus | None, now_ms: int,
             bucket_seconds: int) -> PutPlan | None:
    """Where a put of *key* into *partition* writes, or None if it must not (see ``put``).

    A pending key is rewritten in place, in the bucket it was first written to: the rows of
    an ordering id must stay in the order they were written (see ``ScheduleStore.put``). If
    its row is in another partition (the topic was migrated), that row goes.
    """
    if current is not None and _kept(key, current):
        return None
    bucket = write_bucket(key.scheduled_ms, now_ms, bucket_seconds)
    if current is None or current.state is not State.PENDING or current.bucket is None:
        return PutPlan(bucket)
    if current.partition == partition:
        return PutPlan(current.bucket)
    return PutPlan(bucket, (current.partition, current.bucket))


def may_cancel(current: TaskStatus | None) -> bool:
    """Whether a cancel may remove the key: pending, or failed with its row kept (blocked).

    For a failed key the store checks that its row is still there.
    """
    return (current is not None and current.bucket is not None
            and next_state(current.state, Event.CANCEL) is not None)


def may_retry(current: TaskStatus | None) -> bool:
    """Whether an operator's retry may make the key pending again: only a failed one."""
    return current is not None and next_state(current.state, Event.RETRY) is not None


def _times(run: RunTimes | None) -> Pairs:
    released, started, ended = run or RunTimes()
    return (("released_ms", released), ("started_ms", started), ("finished_ms", ended))


def _whole(current: TaskStatus, state: State, now_ms: int, *, partition: int | None = None,
           bucket: int | None = None, attempts: int | None = None,
           last_error: str | None = None) -> Pairs:
    """The fields every final or retried status is written with, from *current* unless given."""
    return (("state", state), ("task", current.task),
            ("partition", current.partition if partition is None else partition),
            ("bucket", current.bucket if bucket is None else bucket),
            ("attempts", current.attempts if attempts is None else attempts),
            ("last_error", current.last_error if last_error is None else last_error),
            ("updated_ms", now_ms))


# The names each transition on a dispatcher's hot path writes, in the order of its values.
SCHEDULED = ("state", "task", "partition", "bucket", "attempts", "last_error", "outcome",
             "outcome_attempt", "updated_ms")
RELEASED_ROW = ("attempts", "lease_until_ms")
RELEASED = ("state", "attempts", "updated_ms")
RETRY_LATER_ROW = ("attempts", "not_before_ms", "lease_until_ms")
RETRY_LATER = ("state", "attempts", "last_error", "updated_ms")
FINISHED = ("state", "task", "partition", "bucket", "attempts", "last_error", "updated_ms",
            "released_ms", "started_ms", "finished_ms")
FINISHED_KEPT = (*FINISHED, "envelope")
BLOCKED_ROW = ("blocked", "lease_until_ms")
REPORTED_SUCCESS = ("state", "outcome", "outcome_attempt", "outcome_generation", "updated_ms",
                    "started_ms", "finished_ms")
REPORTED_FAILURE = ("outcome", "outcome_attempt", "outcome_generation", "last_error",
                    "updated_ms", "started_ms", "finished_ms")


# --- decided from the key's status -----------------------------------------------------------

def scheduled(partition: int, envelope: ScheduleEnvelope, current: TaskStatus | None, now_ms: int,
              bucket_seconds: int, data: bytes | None = None) -> Transition | None:
    """A schedule record of *envelope*'s key, read for *partition*: None if it must not be written."""
    key = envelope.key
    plan = plan_put(partition, key, current, now_ms, bucket_seconds)
    if plan is None:
        return None
    task = StoredTask(partition, plan.bucket, envelope)
    return Transition(key, Event.SCHEDULE, State.PENDING,
                      RowWrite(RowKind.INSERT, partition, plan.bucket, task=task, data=data,
                               moved_from=plan.moved_from),
                      SCHEDULED, (State.PENDING, envelope.task, partition, plan.bucket, 0, None,
                                  None, 0, now_ms),
                      Expiry.NEVER)


def cancelled(current: TaskStatus | None, now_ms: int, *, row_kept: bool = True) -> Transition | None:
    """A cancel of the key *current* describes; None if there is nothing it may cancel.

    *row_kept*: for a failed key, whether its row is still in the schedule (it is blocked).
    """
    if not may_cancel(current):
        return None
    assert current is not None and current.bucket is not None
    if current.state is State.FAILED and not row_kept:
        return None  # failed and gone: nothing to cancel
    return transition_of(current.key, Event.CANCEL, State.CANCELLED,
                       RowWrite(RowKind.DELETE, current.partition, current.bucket),
                       _whole(current, State.CANCELLED, now_ms) + _times(None), Expiry.FINAL)


def reschedule_problem(current: TaskStatus | None, moved_to: TaskKey | None, to: TaskKey) -> str | None:
    """Why the key *current* describes may not move to the key *to*; None if it may.

    Only a key that was never released moves: one released, even if it waits for a retry
    now, ran at its time. *moved_to*: the key an earlier reschedule moved it to, if any; a
    reschedule read again (after a failed batch) finds it moved there, and may go on.
    """
    if current is None:
        return "it is unknown: not stored yet, never scheduled, or its status expired"
    key, state = current.key, current.state
    if state is State.RESCHEDULED:
        if moved_to == to:
            return None
        return f"it was rescheduled already, to {moved_to}: reschedule that key"
    if state is State.PENDING and current.attempts == 0 and current.bucket is not None:
        return None
    if state is State.PENDING:
        return (f"it was released already, and waits to be retried after attempt "
                f"{current.attempts}")
    return {State.RELEASED: "it was released to the workers already: it runs at its time",
            State.CANCELLED: "it was cancelled, and a cancel is final",
            }.get(state, f"it {state.value} already ({key} never runs again)")


def rescheduled(partition: int, current: TaskStatus | None, moved_to: TaskKey | None,
                envelope: ScheduleEnvelope, current_new: TaskStatus | None, now_ms: int,
                bucket_seconds: int, data: bytes | None = None
                ) -> tuple[Transition | None, Transition | None] | None:
    """A reschedule of the key *current* describes to *envelope* (its key, another time of
    the same ordering id): the old key's move, and the new key's put. None if it may not
    move (see :func:`reschedule_problem`), or if the new key ran or was cancelled already.

    The old key goes first: a store writes the move, then the put, so that a reschedule
    cut off half-way never leaves both keys to run; read again, it finds the old key moved
    (*moved_to*) and writes only the put. *current_new*: the new key's status; a pending
    one is rewritten in place, as a schedule record of it would be.
    """
    if reschedule_problem(current, moved_to, envelope.key) is not None:
        return None
    assert current is not None
    put = scheduled(partition, envelope, current_new, now_ms, bucket_seconds, data)
    if current.state is State.RESCHEDULED:
        return None, put
    if put is None:
        return None
    assert current.bucket is not None
    move = transition_of(current.key, Event.RESCHEDULE, State.RESCHEDULED,
                       RowWrite(RowKind.DELETE, current.partition, current.bucket),
                       (*_whole(current, State.RESCHEDULED, now_ms), *_times(None),
                        ("envelope", envelope)), Expiry.FINAL)
    return move, put


def retried(partition: int, current: TaskStatus | None, row: StoredTask | None,
            kept: ScheduleEnvelope | None, now_ms: int, bucket_seconds: int) -> Transition | None:
    """An operator's retry of a failed key (see ``ScheduleStore.retry``); None if it may not.

    *row*: its row, if it is still in the schedule (blocked); *kept*: else the task its
    status kept. Its attempts so far stay counted.
    """
    if not may_retry(current):
        return None
    assert current is not None
    if row is not None:
        write = row_update(row.partition, row.bucket,
                        (("blocked", False), ("not_before_ms", 0), ("lease_until_ms", 0)),
                        StoredTask(row.partition, row.bucket, row.envelope, row.attempts))
    elif kept is not None:
        bucket = write_bucket(current.key.scheduled_ms, now_ms, bucket_seconds)
        write = RowWrite(RowKind.INSERT, partition, bucket,
                         task=StoredTask(partition, bucket, kept, attempts=current.attempts))
    else:
        return None
    assert write.task is not None
    status = (*_whole(current, State.PENDING, now_ms, partition=write.partition, bucket=write.bucket),
              ("outcome", current.outcome), ("outcome_attempt", current.outcome_attempt),
              ("envelope", None))
    return transition_of(current.key, Event.RETRY, State.PENDING, write, status, Expiry.NEVER)


def settled(status: TaskStatus | None, partition: int, bucket: int, key: TaskKey,
            error: str | None, now_ms: int) -> Transition:
    """A row of *key* found without a task it can run: it goes, and the key's status is made
    final if the row was its own (see :func:`settled_state`). *error*: why its task cannot
    be read (written by an incompatible version): the key failed."""
    write = RowWrite(RowKind.DELETE, partition, bucket)
    state = settled_state(status, partition, bucket)
    if state is None or status is None:
        return Transition(key, Event.SETTLE, None, write, (), (), Expiry.KEEP)
    if error is not None:
        state = State.FAILED
    return transition_of(key, Event.SETTLE, state, write,
                       _whole(status, state, now_ms, partition=partition, bucket=bucket,
                              last_error=error)
                       + _times(RunTimes(status.released_ms, status.started_ms, status.finished_ms)),
                       Expiry.FINAL)


# --- decided by the dispatcher that holds the key's partition ----------------------------------

def released(task: StoredTask, attempt: int, lease_until_ms: int, now_ms: int) -> Transition:
    """*task* handed to the workers for its *attempt*-th time, leased until a time."""
    return Transition(task.key, Event.RELEASE, State.RELEASED,
                      RowWrite(RowKind.UPDATE, task.partition, task.bucket, RELEASED_ROW,
                               (attempt, lease_until_ms)),
                      RELEASED, (State.RELEASED, attempt, now_ms), Expiry.KEEP)


def retry_later(task: StoredTask, attempts: int, not_before_ms: int, error: str | None,
                now_ms: int) -> Transition:
    """An attempt of *task* failed with attempts left: pending again from *not_before_ms*."""
    return Transition(task.key, Event.RETRY_LATER, State.PENDING,
                      RowWrite(RowKind.UPDATE, task.partition, task.bucket, RETRY_LATER_ROW,
                               (attempts, not_before_ms, 0)),
                      RETRY_LATER, (State.PENDING, attempts, error, now_ms), Expiry.KEEP)


def finished(task: StoredTask, state: State, error: str | None, current: TaskStatus | None,
             now_ms: int, run: RunTimes | None = None) -> Transition:
    """*task* succeeded, failed for good, or expired (its row goes; a failed one keeps its
    task for a retry), with the times of its last attempt. Its last error is *error*, or the
    one *current* (its status) holds."""
    names: tuple[str, ...]
    if state is State.SUCCEEDED:
        event, names = Event.SUCCEED, FINISHED
    elif state is State.FAILED:
        event, names = Event.GIVE_UP, FINISHED_KEPT
    elif state is State.EXPIRED:
        event, names = Event.EXPIRE, FINISHED
    else:
        raise ValueError(f"a task finishes succeeded, failed or expired, not {state.value}")
    last_error = error if error is not None else (current.last_error if current else None)
    released_ms, started_ms, finished_ms = run or RunTimes()
    values: tuple[object, ...] = (state, task.envelope.task, task.partition, task.bucket,
                                  task.attempts, last_error, now_ms, released_ms, started_ms,
                                  finished_ms)
    if state is State.FAILED:
        values = (*values, task.envelope)
    return Transition(task.key, event, state, RowWrite(RowKind.DELETE, task.partition, task.bucket),
                      names, values, Expiry.FINAL)


def blocked(task: StoredTask, error: str | None, current: TaskStatus | None, now_ms: int,
            run: RunTimes | None = None) -> Transition:
    """*task*'s last attempt failed, and its ordering id waits for an operator: failed, its
    row kept (blocked) so that the later tasks of its ordering id stay behind it."""
    last_error = error if error is not None else (current.last_error if current else None)
    released_ms, started_ms, finished_ms = run or RunTimes()
    return Transition(task.key, Event.BLOCK, State.FAILED,
                      RowWrite(RowKind.UPDATE, task.partition, task.bucket, BLOCKED_ROW, (True, 0)),
                      FINISHED, (State.FAILED, task.envelope.task, task.partition, task.bucket,
                                 task.attempts, last_error, now_ms, released_ms, started_ms,
                                 finished_ms),
                      Expiry.NEVER)


def reported(key: TaskKey, attempt: int, succeeded: bool, error: str | None, now_ms: int,
             run: RunTimes | None = None, generation: int = 0) -> Transition:
    """A worker's report of an attempt of *key*, which release of it ran (*generation*) and
    when: the dispatcher acts on it when it next reads the key (a success is final at once)."""
    _, started, ended = run or RunTimes()
    if succeeded:
        return Transition(key, Event.REPORT_SUCCESS, State.SUCCEEDED, None, REPORTED_SUCCESS,
                          (State.SUCCEEDED, "succeeded", attempt, generation, now_ms, started, ended),
                          Expiry.REPORT)
    return Transition(key, Event.REPORT_FAILURE, State.RELEASED, None, REPORTED_FAILURE,
                      ("failed", attempt, generation, error, now_ms, started, ended), Expiry.REPORT)
