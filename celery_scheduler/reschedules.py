"""Reschedule in place: move a pending task to another time, keeping its ordering id, its
uniqueness key and its Celery task id (so ``AsyncResult`` still finds its run).

A task's time is part of its key, so a move is a new key of the same ordering id and
uniqueness key, at the new time. The move is a record on the scheduler topic like every
change to the schedule, applied by the dispatcher that owns the ordering id's partition: the
old key becomes ``rescheduled`` (its status names the new key) and the new key is pending,
in its ordering id's order by its new time. Only a key that was never released moves.

The check here reads the store and refuses at once what cannot move; a reschedule that
races the key's release is decided by the dispatcher, which either moves it (the old time
never fires) or finds it released (it runs at its old time, and the new key never appears),
never both. :meth:`~celery_scheduler.store.base.TaskWriter.reschedule` writes it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from celery_scheduler.audit import note
from celery_scheduler.client import SchedulerClient
from celery_scheduler.envelope import RescheduleEnvelope, ScheduleEnvelope, reschedule_key_problem
from celery_scheduler.errors import NotReschedulableError, ScheduleTimeError
from celery_scheduler.keys import TaskKey, from_epoch_ms, to_epoch_ms
from celery_scheduler.store.base import State
from celery_scheduler.store.lifecycle import reschedule_problem
from celery_scheduler.tasklog.base import Position

__all__ = ["Moved", "moved_to", "new_time_ms", "request_reschedule", "reschedule"]


@dataclasses.dataclass(frozen=True)
class Moved:
    """A reschedule sent: the task's new envelope (its key is the new key), and where the
    record landed on the scheduler topic."""

    envelope: ScheduleEnvelope
    position: Position

    @property
    def key(self) -> TaskKey:
        return self.envelope.key


def new_time_ms(at: dt.datetime | None, countdown: float | dt.timedelta | None, now_ms: int,
                default_tz: dt.tzinfo = dt.timezone.utc) -> int:
    """The new time: *at* (naive: in *default_tz*), or *countdown* from now; exactly one."""
    if (at is None) == (countdown is None):
        raise ScheduleTimeError(f"give the new time as exactly one of at= and countdown=, got "
                                f"at={at!r} and countdown={countdown!r}")
    if at is not None:
        return to_epoch_ms(at, default_tz)
    seconds = countdown.total_seconds() if isinstance(countdown, dt.timedelta) else countdown
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not (
            seconds == seconds and abs(seconds) < 10 ** 11):
        raise ScheduleTimeError(f"countdown must be seconds or a timedelta, got {countdown!r}")
    return now_ms + max(0, int(-(-seconds * 1000 // 1)))


def moved_to(client: SchedulerClient, key: TaskKey) -> TaskKey | None:
    """The key a reschedule moved *key* to, once a dispatcher applied it; None if it did not."""
    status = client.store.status(key)
    if status is None or status.state is not State.RESCHEDULED:
        return None
    kept = client.store.kept_envelope(key)
    return kept.key if kept is not None else None


def reschedule(client: SchedulerClient, key: TaskKey, to_ms: int, *,
               args: Sequence[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
               envelope: ScheduleEnvelope | None = None, task: str | None = None) -> Moved:
    """Move the pending *key* to *to_ms* (epoch ms), with new *args* / *kwargs* if given.

    *envelope*: the task as scheduled, when the caller has it (a schedule handle); else it
    is read from the store. *task*: the task name it must be of, if the caller knows it.
    Raises :class:`NotReschedulableError` with the reason if the
    store says the key cannot move (released, finished, cancelled, moved, or unknown).
    """
    to = TaskKey(key.ordering_id, to_ms, key.uniqueness_key)
    problem = reschedule_key_problem(key, to)
    if problem is not None:
        raise NotReschedulableError(problem)
    store = client.store
    status = store.status(key)
    if status is None and envelope is not None:
        pass  # not stored yet: the dispatcher reads its schedule record first (same partition)
    else:
        moved = moved_to(client, key) if status is not None and status.state is State.RESCHEDULED else None
        problem = reschedule_problem(status, moved, to)
        if problem is not None:
            raise NotReschedulableError(f"cannot reschedule {key}: {problem}")
        if status is not None and status.state is State.RESCHEDULED:
            kept = store.kept_envelope(key)  # asked again: the same move, sent again
            envelope = kept if kept is not None else envelope
        elif envelope is None:
            row = store.task(key)
            if row is None:
                raise NotReschedulableError(
                    f"cannot reschedule {key}: its task is no longer in the schedule (released or "
                    "cancelled meanwhile)")
            envelope = row.envelope
    assert envelope is not None
    if task is not None and envelope.task != task:
        raise NotReschedulableError(f"cannot reschedule {key} as a task of {task}: it is a task of "
                                    f"{envelope.task}")
    options = dict(envelope.options)
    options.setdefault("task_id", envelope.task_id)  # the run keeps the task id it had
    new = dataclasses.replace(
        envelope, key=to, options=options, enqueued_ms=client.clock(),
        args=list(envelope.args if args is None else args),
        kwargs=dict(envelope.kwargs if kwargs is None else kwargs))
    position: Position = client.publish(RescheduleEnvelope(key, new, client.clock()))
    return Moved(new, position)


def request_reschedule(client: SchedulerClient, key: TaskKey, to_ms: int,
                       by: str | None = None) -> Moved:
    """An operator's reschedule of *key* (see :func:`reschedule`), noted in the operators' log."""
    moved = reschedule(client, key, to_ms)
    note(client, "reschedule", str(key), f"to {from_epoch_ms(to_ms).isoformat()}", by=by)
    return moved
