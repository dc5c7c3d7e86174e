"""A scheduled task: the Celery task ``@scheduled_task`` wraps, with the calls that schedule
it, its keys and the operator levers on them (status, cancel, reschedule, retry)."""

from __future__ import annotations

import datetime as dt
import importlib
import inspect
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Generic, ParamSpec, Protocol, TypeVar, cast

from celery.local import PromiseProxy, Proxy

import celery_scheduler.registry as registry
from celery_scheduler.arguments import Binder
from celery_scheduler.batch import Call, ScheduledBatch, check_calls
from celery_scheduler.calls import (
    call_digest,
    check_options,
    check_retry,
    expiry_options,
    scheduled_ms_of,
)
from celery_scheduler.client import SchedulerClient, get_client
from celery_scheduler.config import Settings
from celery_scheduler.envelope import (
    MAX_TASK_NAME,
    RetryPolicy,
    ScheduleEncoder,
    ScheduleEnvelope,
    encode,
    encode_arguments,
)
from celery_scheduler.errors import (
    InvalidKeyError,
    NotAScheduledTaskError,
    ScheduleError,
)
from celery_scheduler.handles import ScheduleHandle, checked_key
from celery_scheduler.handles import cancel as cancel_key
from celery_scheduler.key_specs import KeySpec, resolver, source
from celery_scheduler.keys import KeyInput, TaskKey, key_text, to_epoch_ms
from celery_scheduler.store.base import TaskStatus
from celery_scheduler.tasklog.base import Position
from celery_scheduler.tasklog.kafka import STUCK_GRACE
from celery_scheduler.tracing import traced_options

__all__ = ["CeleryTask", "ScheduledTask"]

P = ParamSpec("P")
R = TypeVar("R", covariant=True)


class CeleryTask(Protocol[P, R]):
    """What ``@scheduled_task`` takes, as a type checker sees it: a Celery task, whose
    ``run`` has the decorated function's signature where the task's type says so (with
    celery-types, a ``@shared_task``; its ``@app.task`` tasks take any arguments), and any
    arguments otherwise."""

    def run(self, *args: P.args, **kwargs: P.kwargs) -> R: ...


# Encoders a scheduled task keeps, one per retry policy its calls use (most use one).
MAX_ENCODERS = 8


def _registered_task(name: str, module: str) -> ScheduledTask[..., Any]:
    task: ScheduledTask[..., Any] | None = registry.get(name)
    if task is None:
        importlib.import_module(module)
        task = registry.get(name)
    if task is None:
        raise NotAScheduledTaskError(f"importing {module} defined no scheduled task {name}")
    return task


class ScheduledTask(Generic[P, R]):
    """A Celery task that can also be scheduled; every other attribute is the task's own.

    Generic in the task's parameters and result, as Celery's ``Task`` is in celery-types:
    with those stubs installed, a type checker holds ``schedule_at``, ``schedule_in`` and
    ``key_at`` to the task's own signature.
    """

    def __init__(self, task: CeleryTask[P, R], *, ordering_id: KeySpec | None, uniqueness_key: KeySpec | None,
                 retry: RetryPolicy | None) -> None:
        self.task: Any = cast(Any, task)  # Celery's task (or its proxy), untyped within
        self.name: str = self.task.name
        if not isinstance(self.name, str) or not self.name or len(self.name) > MAX_TASK_NAME:
            raise NotAScheduledTaskError(
                f"task name {self.name!r:.80} cannot be scheduled: it must be a non-empty string "
                f"of at most {MAX_TASK_NAME} characters; give the task a shorter name=")
        try:
            signature = inspect.signature(task.run)
        except (TypeError, ValueError):  # some callables have no signature; bind loosely
            signature = inspect.Signature([
                inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL),
                inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)])
        self.signature = signature
        self._binder = Binder(signature, getattr(task.run, "__name__", "task"))
        self._ordering_id = resolver(ordering_id, "ordering id", self._binder, self.name)
        self._uniqueness_key = resolver(uniqueness_key, "uniqueness key", self._binder, self.name)
        # both keys of a call from its arguments in one compiled call (schedule_many's)
        self._keys_of = (self._binder.compile_keys(source(ordering_id), source(uniqueness_key))
                         if ordering_id is not None and uniqueness_key is not None else None)
        self._retry = retry
        self._resolved: Any = None  # the task behind @app.task's proxy, once it resolved
        self._zone: tuple[Any, Any] = (None, None)  # an app and its timezone, read once
        # by retry policy and size limit: the encoders of calls without Celery options
        self._encoders: dict[tuple[RetryPolicy, int | None], ScheduleEncoder] = {}

    @property
    def retry_policy(self) -> RetryPolicy | None:
        """The retry policy given to ``@scheduled_task`` (None: the settings' policy)."""
        return self._retry

    def _app(self) -> Any:
        """The task's Celery app, without the proxy's cost on every call where it can be saved.

        ``@app.task`` returns a proxy that resolves to one task object for good: it is looked
        through once. ``@shared_task``'s proxy finds the current app's task on each use.
        """
        task = self._resolved
        if task is None:
            task = self.task
            if isinstance(task, PromiseProxy):
                task = self._resolved = task._get_current_object()
            elif not isinstance(task, Proxy):
                self._resolved = task
        return task._get_app()

    def _timezone(self, app: Any) -> Any:
        zone = self._zone
        if zone[0] is not app:  # Celery, too, reads an app's timezone once
            zone = self._zone = (app, app.timezone)
        return zone[1]

    # --- Celery behaviour is unchanged ---------------------------------------------------

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        result: R = self.task(*args, **kwargs)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.task, name)

    def __repr__(self) -> str:
        return f"<@scheduled_task {self.name}>"

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        # Another process (a Spark executor) finds the same task by importing its module.
        return (_registered_task, (self.name, self.task.run.__module__))

    # --- scheduling ------------------------------------------------------------------------

    @property
    def client(self) -> SchedulerClient:
        return get_client(self._app())

    def schedule_at(self, when: dt.datetime, *args: P.args, **kwargs: P.kwargs) -> ScheduleHandle:
        """Run ``task(*args, **kwargs)`` at *when*; returns once Kafka acknowledged the call.

        >>> send_reminder.schedule_at(datetime(2030, 1, 1, tzinfo=timezone.utc),  # doctest: +SKIP
        ...                           "customer-42", reminder_kind="new-year")
        <ScheduleHandle proj.tasks.send_reminder customer-42@2030-01-01T00:00:00+00:00#new-year>
        """
        return self.schedule(args, kwargs, at=when)

    def schedule_in(self, delay: float | dt.timedelta, *args: P.args, **kwargs: P.kwargs
                    ) -> ScheduleHandle:
        """Run ``task(*args, **kwargs)`` after *delay* (seconds or a timedelta)."""
        return self.schedule(args, kwargs, countdown=delay)

    def schedule(self, args: Sequence[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
                 *, at: dt.datetime | None = None, countdown: float | dt.timedelta | None = None,
                 ordering_id: KeyInput | None = None, uniqueness_key: KeyInput | None = None,
                 retry: RetryPolicy | None = None, wait: bool = True, **options: Any
                 ) -> ScheduleHandle:
        """The ``apply_async``-style form, with explicit arguments, keys and Celery options.

        Exactly one of *at* and *countdown* is required. *ordering_id* and *uniqueness_key*
        override the decorator's. Other keyword arguments are Celery options used at release
        (``queue``, ``routing_key``, ``exchange``, ``priority``, ``time_limit``,
        ``soft_time_limit``, ``expires``, ``headers``, ``shadow``). With ``wait=False`` the
        call returns at once; ``handle.wait()`` or ``flush(app)`` waits for Kafka.

        ``expires`` (seconds after *at*, a timedelta, or an aware datetime; the task's own
        ``expires=`` by default) is a deadline: a task the dispatchers could not release by
        then (they were down, or its ordering id was paused) is not run late but marked
        ``expired``, and its ordering id moves on.

        >>> send_reminder.schedule(("customer-42",), {"reminder_kind": "x"},  # doctest: +SKIP
        ...                        countdown=60, queue="mail", wait=False)
        """
        app = self._app()
        client = get_client(app)
        envelope = self._build(args or (), kwargs or {}, at, countdown, ordering_id,
                               uniqueness_key, retry, options, client, app)
        key = envelope.key
        return ScheduleHandle(client, envelope, client.publish_record(
            key.ordering_id, self._encode(envelope, client.settings), wait), app=app)

    def _encode(self, envelope: ScheduleEnvelope, settings: Settings) -> bytes:
        """The envelope's bytes; without options, through an encoder kept per retry policy."""
        if envelope.options:
            return encode(envelope, settings.max_envelope_bytes)
        encoders = self._encoders
        found = (envelope.retry, settings.max_envelope_bytes)
        encoder = encoders.get(found)
        if encoder is None:
            encoder = ScheduleEncoder(self.name, {}, envelope.retry, settings.max_envelope_bytes)
            if len(encoders) < MAX_ENCODERS:  # calls that each pass a new policy: no cache
                encoders[found] = encoder
        key = envelope.key
        return encoder.encode(key.ordering_id, key.scheduled_ms, key.uniqueness_key,
                              envelope.args, envelope.kwargs, envelope.enqueued_ms)

    def build(self, args: Sequence[Any], kwargs: Mapping[str, Any], *,
              at: dt.datetime | None = None, countdown: float | dt.timedelta | None = None,
              ordering_id: KeyInput | None = None, uniqueness_key: KeyInput | None = None,
              retry: RetryPolicy | None = None, options: Mapping[str, Any] | None = None,
              client: SchedulerClient | None = None) -> ScheduleEnvelope:
        """Validate a call and return its envelope without publishing it."""
        app = self._app()
        return self._build(args, kwargs, at, countdown, ordering_id, uniqueness_key, retry,
                           options, client or get_client(app), app)

    def _build(self, args: Sequence[Any], kwargs: Mapping[str, Any], at: dt.datetime | None,
               countdown: float | dt.timedelta | None, ordering_id: KeyInput | None,
               uniqueness_key: KeyInput | None, retry: RetryPolicy | None,
               options: Mapping[str, Any] | None, client: SchedulerClient, app: Any
               ) -> ScheduleEnvelope:
        settings = client.settings
        current = client.clock()
        scheduled_ms = scheduled_ms_of(at, countdown, current, self._timezone(app),
                                       settings.grace_seconds)
        check_retry(retry)
        ordering, unique, encoded_args, encoded_kwargs = self._checked(
            args, kwargs, ordering_id, uniqueness_key)
        if settings.opentelemetry:
            options = traced_options(options or {}, settings)
        default_expires = (self._resolved or self.task).expires  # Celery's Task.expires
        if default_expires is not None or (options and "expires" in options):
            options = expiry_options(options, default_expires, scheduled_ms, self._timezone(app))
        return ScheduleEnvelope.checked(
            TaskKey(ordering, scheduled_ms, unique), self.name, encoded_args, encoded_kwargs,
            check_options(options) if options else {},
            retry or self._retry or settings.retry_policy, current)

    def _checked(self, args: Sequence[Any], kwargs: Mapping[str, Any], ordering_id: KeyInput | None,
                 uniqueness_key: KeyInput | None) -> tuple[str, str, list[Any], dict[str, Any]]:
        """A call's ordering id, uniqueness key and JSON arguments, or its ScheduleError."""
        if not isinstance(args, (list, tuple)):
            raise ScheduleError(f"args of task {self.name} must be a list or tuple, got "
                                f"{type(args).__name__} {args!r:.200}")
        if (type(kwargs) is not dict and not isinstance(kwargs, Mapping)) or (
                kwargs and any(type(name) is not str for name in kwargs)):
            raise ScheduleError(f"kwargs of task {self.name} must be a mapping with string keys, "
                                f"got {kwargs!r:.200}")
        try:
            arguments = self._binder.arguments(args, kwargs)
        except TypeError as exc:
            raise ScheduleError(f"arguments do not match task {self.name}: {exc}") from None
        encoded_args, encoded_kwargs = encode_arguments(args, kwargs)
        ordering = ordering_id if ordering_id is not None else (
            self._ordering_id(arguments) if self._ordering_id else None)
        if ordering is None:
            raise InvalidKeyError(
                f"task {self.name} was scheduled without an ordering id; pass ordering_id= "
                "to @scheduled_task or to schedule()"
            )
        ordering = key_text(ordering, "ordering id")
        if uniqueness_key is not None:
            unique = key_text(uniqueness_key, "uniqueness key")
        elif self._uniqueness_key is not None:
            unique = key_text(self._uniqueness_key(arguments), "uniqueness key")
        else:
            # digest the bound form, so f(7, 100) and f(7, amount=100) are the same call
            bound = self._binder.bound(arguments)
            unique = call_digest(self.name, *encode_arguments(bound.args, bound.kwargs))
        return ordering, unique, encoded_args, encoded_kwargs

    def schedule_many(self, calls: Iterable[Call | tuple[Any, ...]], *,
                      retry: RetryPolicy | None = None, wait: bool = True, **options: Any
                      ) -> ScheduledBatch:
        """Schedule many calls at once; each is ``(at, args)`` or ``(at, args, kwargs)``.

        *at* is a datetime (a naive one is in ``app.timezone``). The calls share *retry* and
        the Celery *options* (``queue``, ``priority``, ... as for :meth:`schedule`); their
        ordering ids and uniqueness keys come from the decorator. Every call is checked
        before any is published: one that :meth:`schedule` would refuse raises its error,
        naming the call's index, and nothing is published. The calls then go to Kafka in
        order; the call returns once Kafka acknowledged all of them, or raises
        :class:`~celery_scheduler.errors.TaskLogUnavailableError` (scheduling the same calls
        again is safe: a task key runs once). With ``wait=False`` it returns once they are
        handed to the producer; ``batch.wait()`` or ``flush(app)`` waits for Kafka.

        The checked calls are held in memory until the batch is acknowledged: split a very
        large input into batches of, say, 100,000 calls.

        >>> send_reminder.schedule_many(  # doctest: +SKIP
        ...     (due, (customer_id,), {"reminder_kind": "trial-ends"}) for customer_id, due in rows)
        <ScheduledBatch proj.tasks.send_reminder 5000 call(s), acknowledged>
        """
        app = self._app()
        client = get_client(app)
        checked = check_calls(self, calls, client, self._timezone(app), retry, options)
        batch = ScheduledBatch(self.name, checked, client.publish_many(checked))
        if wait:
            # each record is answered within its delivery timeout once produced; a batch still
            # waiting three of them and 10 s later is given up (its records reported failed)
            batch.wait(3 * client.settings.kafka_produce_timeout + STUCK_GRACE)
        return batch

    def key_at(self, when: dt.datetime, *args: P.args, **kwargs: P.kwargs) -> TaskKey:
        """The key ``schedule_at(when, *args, **kwargs)`` schedules, without scheduling it.

        From the same time and arguments any process finds the same key (ordering id and
        uniqueness key come from the decorator; *when* is rounded up to the millisecond,
        and a naive one read in ``app.timezone``), so a view can reach a task another
        request scheduled: ``task.status(task.key_at(due, customer_id, step="trial-ends"))``.
        A task scheduled with ``schedule_in``/``countdown=`` has the time of the call in its
        key: keep ``handle.key`` instead.
        """
        app = self._app()
        scheduled_ms = to_epoch_ms(when, self._timezone(app))
        ordering, unique, _, _ = self._checked(args, kwargs, None, None)
        return TaskKey(ordering, scheduled_ms, unique)

    def status(self, key: TaskKey) -> TaskStatus | None:
        """What the schedule store knows of the task with *key*, from any process.

        None until a dispatcher has stored it (a second or so after the schedule call, or
        longer while no dispatcher runs): see :class:`~celery_scheduler.TaskStatus`.
        """
        return self.client.store.status(checked_key(key))

    def cancel(self, key: TaskKey) -> Position:
        """Cancel the pending task with *key*, as :meth:`ScheduleHandle.cancel` does.

        *key* is ``handle.key``, a :meth:`key_at`, a key from a status listing, or one built
        from its parts: ``TaskKey(ordering_id, scheduled_ms, uniqueness_key)``.
        """
        return cancel_key(self.client, checked_key(key))

    def reschedule(self, key: TaskKey, at: dt.datetime | None = None, *,
                   countdown: float | dt.timedelta | None = None,
                   args: Sequence[Any] | None = None, kwargs: Mapping[str, Any] | None = None
                   ) -> TaskKey:
        """Move the pending task with *key* to another time, as
        :meth:`ScheduleHandle.reschedule` does; returns its new key.

        Its task is read from the store: raises
        :class:`~celery_scheduler.errors.NotReschedulableError` if it is not stored (yet),
        was released, finished, cancelled or moved already.
        """
        from celery_scheduler.reschedules import new_time_ms, reschedule

        app = self._app()
        to_ms = new_time_ms(at, countdown, self.client.clock(), self._timezone(app))
        return reschedule(self.client, checked_key(key), to_ms, args=args, kwargs=kwargs,
                          task=self.name).key

    def retry(self, key: TaskKey) -> None:
        """Run the failed task with *key* once more (see ``celery ... scheduler retry``).

        Raises :class:`~celery_scheduler.errors.NotRetryableError` if it is not failed, or
        failed before its task was kept for a retry.
        """
        from celery_scheduler.operations import request_retry

        request_retry(self.client, key)
