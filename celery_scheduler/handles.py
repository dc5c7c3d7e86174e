"""What a schedule call returns: :class:`ScheduleHandle`, the task key with status, cancel,
reschedule, retry and result for it; and the checks of a key given back to the API."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from celery_scheduler.client import SchedulerClient
from celery_scheduler.envelope import CancelEnvelope, ScheduleEnvelope
from celery_scheduler.errors import InvalidKeyError
from celery_scheduler.keys import TaskKey
from celery_scheduler.store.base import TaskStatus
from celery_scheduler.tasklog.base import Ack, Position

__all__ = ["ScheduleHandle", "cancel", "checked_key"]


def checked_key(key: object) -> TaskKey:
    if not isinstance(key, TaskKey):
        raise InvalidKeyError(
            f"expected a TaskKey, got {type(key).__name__} {key!r:.200}; keep handle.key, use "
            "task.key_at(when, *args, **kwargs), or build one with "
            "TaskKey(ordering_id, scheduled_ms, uniqueness_key)")
    return key


def cancel(client: SchedulerClient, key: TaskKey) -> Position:
    position: Position = client.publish(CancelEnvelope(key, client.clock()))
    return position


class ScheduleHandle:
    """What a schedule call returns: the task key, and status, cancel and retry for it."""

    def __init__(self, client: SchedulerClient, envelope: ScheduleEnvelope,
                 result: Position | Ack, app: Any = None) -> None:
        self._client = client
        self.envelope = envelope
        self._result = result
        self._app = app  # the task's Celery app, for result(); None: Celery's current app

    @property
    def key(self) -> TaskKey:
        return self.envelope.key

    @property
    def task_id(self) -> str:
        """The Celery task id the task will run with (shows in Flower and result backends)."""
        return self.envelope.task_id

    def wait(self, timeout: float | None = None) -> Position:
        """Block until Kafka acknowledged the record (immediate for synchronous calls)."""
        if isinstance(self._result, Ack):
            return self._result.result(timeout)
        return self._result

    def done(self) -> bool:
        return not isinstance(self._result, Ack) or self._result.done()

    def status(self) -> TaskStatus | None:
        """Current status from the schedule store; None until a dispatcher has stored it."""
        return self._client.store.status(self.key)

    def cancel(self) -> Position:
        """Ask for the task not to run; takes effect unless it was already released.

        Returns once Kafka acknowledged the cancel, with where it landed (raises
        :class:`~celery_scheduler.errors.TaskLogUnavailableError` if it could not be had:
        cancelling again is safe). A dispatcher releases a task up to
        ``scheduler_release_ahead_seconds`` (0.5 s) before its due time (the worker holds it
        until then): a cancel acknowledged before then wins, and :meth:`status` says
        ``cancelled`` once a dispatcher read it; one acknowledged later may find the task
        released, and then it runs.
        """
        return cancel(self._client, self.key)

    def reschedule(self, at: dt.datetime | None = None, *,
                   countdown: float | dt.timedelta | None = None,
                   args: Sequence[Any] | None = None, kwargs: Mapping[str, Any] | None = None
                   ) -> ScheduleHandle:
        """Move the task to another time (exactly one of *at* and *countdown*), with new
        *args* / *kwargs* if given; returns the handle of the moved task.

        The task keeps its ordering id, its uniqueness key and its task id (``result()``
        still finds its run), and takes its place in its ordering id's order by the new time.
        Returns once Kafka acknowledged the move. Raises
        :class:`~celery_scheduler.errors.NotReschedulableError` with the reason if the task
        was released already (it runs at its time), finished, cancelled, or moved (move the
        handle this returned). A move that races the release is decided by the dispatcher:
        the task either moves (this key's status becomes ``rescheduled``, and its old time
        never fires) or runs at its old time (this key's status says ``released``, and the
        returned key never appears), never both.
        """
        from celery_scheduler.reschedules import new_time_ms, reschedule

        tz = getattr(self._app, "timezone", None) or dt.timezone.utc
        moved = reschedule(self._client, self.key,
                           new_time_ms(at, countdown, self._client.clock(), tz),
                           args=args, kwargs=kwargs, envelope=self.envelope)
        return ScheduleHandle(self._client, moved.envelope, moved.position, app=self._app)

    def retry(self) -> None:
        """Run the task once more after it failed (see :meth:`ScheduledTask.retry`)."""
        from celery_scheduler.operations import request_retry

        request_retry(self._client, self.key)

    def result(self) -> Any:
        """The Celery ``AsyncResult`` of the task's run, for apps with a result backend.

        The task id is derived from the task key, so this works in any process that knows
        the key, before or after the task was released: ``handle.result().get(timeout=60)``
        waits for the return value, ``.state`` is ``PENDING`` until a worker starts it. A
        run the scheduler retries keeps the same id, so the result is the last attempt's.
        """
        from celery.result import AsyncResult

        return AsyncResult(self.task_id, app=self._app)

    def __repr__(self) -> str:
        return f"<ScheduleHandle {self.envelope.task} {self.key}>"
