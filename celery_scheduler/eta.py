"""The drop-in eta mode: existing ``apply_async(eta=...)`` / ``countdown=`` code, made durable.

::

    from celery_scheduler.eta import DurableEtaTask

    app = Celery("proj", task_cls=DurableEtaTask)      # every task of the app, or
    @app.task(base=DurableEtaTask)                      # only the tasks chosen
    def send_reminder(customer_id): ...

    result = send_reminder.apply_async(("customer-42",), countdown=3 * 24 * 3600)
    result.revoke()                                     # cancels it in the scheduler

A call with an ``eta`` or ``countdown`` (at least ``scheduler_eta_threshold_seconds`` ahead)
is not sent to the broker, where a worker would hold it in memory until it is due (and lose
or run it twice when killed, or when the eta lies beyond the broker's visibility timeout):
it is scheduled like ``schedule_at``, with the task id as both its ordering id (so it waits
for no other task) and its uniqueness key, and it runs with that task id, so
``AsyncResult(task_id)`` and result backends work as before. A task id names one task, as in
Celery: a call made again with the same ``task_id`` (whose countdown then gives a later eta)
moves the task to the later time, with that call's arguments, while it waits; once it was
released, ran or was revoked, the call runs nothing (see ``dispatcher.naming``).
A call without a delay goes to Celery unchanged.

Revoking: the returned result's ``revoke()`` cancels the scheduled task (and revokes a run
already released, as Celery does); with only the id, ``revoke(app, task_id)`` cancels it.
``app.control.revoke(task_id)`` reaches only workers, so it cannot stop a task that is still
waiting in the scheduler.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import TYPE_CHECKING, Any

from celery import Task, uuid
from celery.result import AsyncResult

if TYPE_CHECKING:  # generic in the stubs only
    _AsyncResult = AsyncResult[Any]
    _Task = Task[Any, Any]
else:
    _AsyncResult, _Task = AsyncResult, Task

from celery_scheduler.api import ScheduledTask, ScheduleHandle, as_scheduled, scheduled_task
from celery_scheduler.client import get_client
from celery_scheduler.config import get_settings
from celery_scheduler.envelope import CELERY_OPTIONS, CancelEnvelope
from celery_scheduler.errors import ScheduleError, ScheduleTimeError
from celery_scheduler.keys import to_epoch_ms
from celery_scheduler.partitioner import partition_for
from celery_scheduler.store.base import TaskStatus

__all__ = ["DurableEtaTask", "ScheduledResult", "revoke", "status"]

# apply_async options that make no difference to a task that is scheduled: Celery passes
# some of them itself, and the scheduler's own retries replace a publish retry policy.
_IGNORED = frozenset({"retry", "retry_policy", "serializer", "compression", "delivery_mode",
                      "mandatory", "immediate", "reply_to", "correlation_id", "add_to_parent",
                      "ignore_result", "task_type", "result_cls"})


class ScheduledResult(_AsyncResult):
    """The ``AsyncResult`` of a task the scheduler holds: ``revoke()`` also cancels it there."""

    def __init__(self, id: str, *args: Any, handle: ScheduleHandle, **kwargs: Any) -> None:
        super().__init__(id, *args, **kwargs)
        self.handle = handle

    def __reduce__(self) -> tuple[Any, ...]:
        return AsyncResult, self.__reduce_args__()  # elsewhere: an ordinary result of the id

    def revoke(self, *args: Any, **kwargs: Any) -> None:
        """Cancel it in the scheduler, and revoke a copy already released (as Celery does)."""
        self.handle.cancel()
        super().revoke(*args, **kwargs)

    def schedule_status(self) -> TaskStatus | None:
        """The scheduler's status of it (pending, released, ...); None until stored."""
        return self.handle.status()


class DurableEtaTask(_Task):
    """A Celery task whose delayed calls go through the durable scheduler."""

    @classmethod
    def on_bound(cls, app: Any) -> None:
        # Make the task a scheduled task of its app once it is bound (the dispatcher releases
        # only registered tasks, and workers must run only current releases of it).
        super().on_bound(app)
        task = app._tasks.get(cls.name) if cls.name else None
        if task is not None and not isinstance(task, ScheduledTask) and cls.name not in _bound:
            _bound.add(cls.name)
            scheduled_task(task)

    def apply_async(self, args: Any = None, kwargs: Any = None, task_id: str | None = None,
                    producer: Any = None, link: Any = None, link_error: Any = None,
                    shadow: str | None = None, **options: Any) -> Any:
        when = self._durable_time(options)
        if when is None:
            return super().apply_async(args, kwargs, task_id, producer, link, link_error, shadow,
                                       **options)
        unsupported = sorted(name for name in options if name not in CELERY_OPTIONS
                             and name not in _IGNORED and name not in ("eta", "countdown"))
        if link is not None or link_error is not None:
            unsupported.append("link" if link is not None else "link_error")
        if producer is not None:
            unsupported.append("producer")
        if unsupported:
            raise ScheduleError(
                f"{self.name}.apply_async with an eta or countdown goes through the scheduler, "
                f"which cannot carry {', '.join(unsupported)}; call it without them, or send "
                "it to Celery as usual with a delay under scheduler_eta_threshold_seconds")
        chosen = {name: value for name, value in options.items() if name in CELERY_OPTIONS}
        expires = chosen.get("expires", self.expires)
        if isinstance(expires, (int, float)) and not isinstance(expires, bool):
            # Celery counts a number of seconds from the call; the scheduler keeps a deadline
            # after the scheduled time: the same moment, made a time here
            now = dt.datetime.fromtimestamp(get_client(self.app).clock() / 1000, dt.timezone.utc)
            chosen["expires"] = now + dt.timedelta(seconds=expires)
        elif expires is not None:
            chosen["expires"] = expires
        if shadow is not None:
            chosen["shadow"] = shadow
        task_id = task_id or uuid()
        chosen["task_id"] = task_id
        handle = as_scheduled(self).schedule(args or (), kwargs or {}, at=when,
                                             ordering_id=task_id, uniqueness_key=task_id, **chosen)
        return ScheduledResult(task_id, handle=handle, app=self.app, task_name=self.name)

    def _durable_time(self, options: dict[str, Any]) -> dt.datetime | None:
        """When the call runs, if it goes through the scheduler; None if it goes to Celery."""
        eta, countdown = options.get("eta"), options.get("countdown")
        if (eta is None and countdown is None) or self.app.conf.task_always_eager:
            return None
        client = get_client(self.app)
        now = client.clock()
        if eta is not None:
            if isinstance(eta, str):
                try:
                    eta = dt.datetime.fromisoformat(eta)
                except ValueError:
                    raise ScheduleTimeError(f"eta {eta!r} is not an ISO 8601 time") from None
            if not isinstance(eta, dt.datetime):
                raise ScheduleTimeError(f"eta must be a datetime, got {type(eta).__name__} {eta!r}")
            at_ms = to_epoch_ms(eta, self.app.timezone)
        else:
            if isinstance(countdown, bool) or not isinstance(countdown, (int, float)) or not (
                    math.isfinite(countdown)):
                raise ScheduleTimeError(f"countdown must be a number of seconds, got {countdown!r}")
            at_ms = now + int(countdown * 1000)
        if at_ms - now < get_settings(self.app).eta_threshold_seconds * 1000:
            return None
        return dt.datetime.fromtimestamp(at_ms / 1000, dt.timezone.utc)


_bound: set[str] = set()


def _pending_keys(app: Any, task_id: str) -> list[Any]:
    client = get_client(app)
    partition = partition_for(task_id, client.task_log.partitions())
    return [row.key for row in client.store.rows_of(partition, task_id)
            if row.envelope.task_id == task_id]


def revoke(app: Any, task_id: str) -> int:
    """Cancel the scheduled task that ``apply_async`` gave *task_id*; return how many."""
    client = get_client(app)
    keys = _pending_keys(app, task_id)
    for key in keys:
        client.publish(CancelEnvelope(key, client.clock()))
    return len(keys)


def status(app: Any, task_id: str) -> TaskStatus | None:
    """The scheduler's status of the task with *task_id*, while it is in the schedule."""
    keys = _pending_keys(app, task_id)
    return get_client(app).store.status(keys[0]) if keys else None
