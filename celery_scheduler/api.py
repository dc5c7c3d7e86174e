"""The user-facing API: ``@scheduled_task`` and the handles its calls return.

::

    from celery_scheduler import scheduled_task

    @scheduled_task(ordering_id="customer_id", uniqueness_key="reminder_kind")
    @app.task
    def send_reminder(customer_id: str, reminder_kind: str) -> None: ...

    handle = send_reminder.schedule_in(3600, "customer-42", reminder_kind="trial-ends")
    handle.status()   # pending, released, succeeded, failed or cancelled
    handle.cancel()

Naive datetimes are read in Celery's ``app.timezone`` (UTC unless the app sets
``timezone``), as Celery reads a naive ``eta``. The task it returns is
:class:`~celery_scheduler.scheduled.ScheduledTask`; how it finds a call's keys,
:mod:`celery_scheduler.key_specs`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any, overload

import celery_scheduler.registry as registry
from celery_scheduler.client import get_client
from celery_scheduler.envelope import RetryPolicy
from celery_scheduler.errors import NotAScheduledTaskError, ScheduleError
from celery_scheduler.handles import ScheduleHandle
from celery_scheduler.key_specs import KeySpec, constant
from celery_scheduler.scheduled import (
    CeleryTask,
    P,
    R,
    ScheduledTask,
    _registered_task,  # noqa: F401  (tasks pickled before it moved name it here)
)
from celery_scheduler.tracing import install as install_tracing

__all__ = ["KeySpec", "ScheduleHandle", "ScheduledTask", "as_scheduled", "constant", "flush",
           "registered", "scheduled_task"]


def registered(app: Any = None) -> Mapping[str, ScheduledTask[..., Any]]:
    """Return the scheduled tasks defined in this process, by Celery task name.

    With *app*, only those of that Celery app (in its task registry): what a dispatcher
    running *app* may release.
    """
    return registry.tasks(app)


@overload
def scheduled_task(task: CeleryTask[P, R], *, ordering_id: KeySpec | None = None,
                   uniqueness_key: KeySpec | None = None, max_attempts: int | None = None,
                   retry_backoff: float | None = None, retry_backoff_max: float | None = None
                   ) -> ScheduledTask[P, R]: ...


@overload
def scheduled_task(task: None = None, *, ordering_id: KeySpec | None = None,
                   uniqueness_key: KeySpec | None = None, max_attempts: int | None = None,
                   retry_backoff: float | None = None, retry_backoff_max: float | None = None
                   ) -> Callable[[CeleryTask[P, R]], ScheduledTask[P, R]]: ...


def scheduled_task(task: Any = None, *, ordering_id: KeySpec | None = None,
                   uniqueness_key: KeySpec | None = None, max_attempts: int | None = None,
                   retry_backoff: float | None = None, retry_backoff_max: float | None = None
                   ) -> Any:
    """Make an existing Celery task schedulable, in order per ordering id.

    *ordering_id* and *uniqueness_key* are each the name of a task parameter, a callable
    taking the task's arguments, or ``constant("...")``. Without *uniqueness_key* the key
    is a digest of the call's arguments. The retry settings override the app's
    ``scheduler_max_attempts`` / ``scheduler_retry_backoff`` / ``scheduler_retry_backoff_max``.

    >>> @scheduled_task(ordering_id="customer_id")  # doctest: +SKIP
    ... @app.task
    ... def charge(customer_id: str, cents: int) -> None: ...
    """

    def decorate(celery_task: Any) -> ScheduledTask[Any, Any]:
        if isinstance(celery_task, ScheduledTask):
            raise NotAScheduledTaskError(f"{celery_task!r} is already a scheduled task")
        if not (hasattr(celery_task, "name") and hasattr(celery_task, "run")
                and hasattr(celery_task, "_get_app")):
            raise NotAScheduledTaskError(
                f"@scheduled_task decorates a Celery task, got {celery_task!r}; put it above "
                "@app.task or @shared_task"
            )
        retry = None
        if (max_attempts, retry_backoff, retry_backoff_max) != (None, None, None):
            defaults = RetryPolicy()
            try:
                retry = RetryPolicy(
                    max_attempts if max_attempts is not None else defaults.max_attempts,
                    retry_backoff if retry_backoff is not None else defaults.backoff,
                    retry_backoff_max if retry_backoff_max is not None else defaults.backoff_max)
            except ValueError as exc:
                raise ScheduleError(f"retry settings of {celery_task.name}: {exc}") from None
        if getattr(celery_task, "max_retries", 3) is None:
            warnings.warn(
                f"task {celery_task.name} has max_retries=None: Celery's own retry would send "
                "copies that run outside the scheduler's ordering; the scheduler owns retries "
                "of scheduled runs (scheduler_max_attempts), so give max_retries a number",
                stacklevel=2)
        from celery_scheduler.worker import guard_stale_releases, install_worker_hooks

        install_worker_hooks()  # workers that import this task report its outcomes
        guard_stale_releases(celery_task)  # and run only the current release of a key
        install_tracing()  # its runs are spans, for an app with scheduler_opentelemetry
        wrapped: ScheduledTask[Any, Any] = ScheduledTask(celery_task, ordering_id=ordering_id,
                                uniqueness_key=uniqueness_key, retry=retry)
        registry.add(wrapped.name, wrapped)
        return wrapped

    return decorate(task) if task is not None else decorate


def as_scheduled(task: Any) -> ScheduledTask[..., Any]:
    """Return *task* as a ScheduledTask, or raise NotAScheduledTaskError."""
    if isinstance(task, ScheduledTask):
        return task
    name = getattr(task, "name", None)
    found: ScheduledTask[..., Any] | None = registry.get(name) if isinstance(name, str) else None
    if found is not None:
        return found
    raise NotAScheduledTaskError(
        f"{task!r} is not a scheduled task; decorate it with @scheduled_task(ordering_id=...)"
    )


def flush(app: Any, timeout: float | None = None) -> int:
    """Wait until every ``wait=False`` schedule call of *app* is acknowledged by Kafka."""
    return get_client(app).flush(timeout)

