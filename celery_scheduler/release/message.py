"""A release as a Celery message: the task name, its arguments, the user's Celery options, a
task id derived from the task key (so retries and re-releases of one key share an id,
visible as such in Flower), and a ``celery_scheduler`` header that tells the worker-side
hooks which key and attempt the execution belongs to.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
from typing import Any, NamedTuple

from celery import signals
from celery.utils.nodenames import anon_nodename
from kombu.utils.json import loads as _kombu_loads

from celery_scheduler.envelope import ScheduleEnvelope
from celery_scheduler.release.redis_push import Document, RedisPush
from celery_scheduler.release.template import Templates
from celery_scheduler.wire import HEADER, Release

__all__ = ["ARGS_REPR_LIMIT", "CELERY_RETRIES_EXHAUSTED", "SendContext", "publish", "send_release",
           "task_message"]


# The scheduler owns retries of scheduled runs. Released messages say they have been retried
# this often already, so Celery's own retry (self.retry, autoretry_for) finds its limit
# reached and raises the failure, which the scheduler retries in order, instead of sending
# a copy of the task that would run outside the ordering.
CELERY_RETRIES_EXHAUSTED = 2**31 - 1
# Longest argument text a released message shows (Celery's own default for argsrepr).
ARGS_REPR_LIMIT = 1024


def _tagged(value: Any) -> bool:
    """Whether *value* holds an object kombu's JSON encoder tagged (``{"__type__": ...}``).

    Decoded JSON: only dicts and lists hold anything; a loop over their items that descends
    into containers alone took half the time of a generator over every item."""
    kind = type(value)
    if kind is dict:
        if "__type__" in value:
            return True
        items = value.values()
    elif kind is list:
        items = value
    else:
        return False
    for item in items:
        inner = type(item)
        if (inner is dict or inner is list) and _tagged(item):
            return True
    return False


def _arguments(envelope: ScheduleEnvelope) -> tuple[list[Any], dict[str, Any]]:
    # Turn kombu's tagged JSON (datetimes, UUIDs, ...) back into objects, so the task gets
    # them whatever serializer the app uses. Most arguments hold none: skip the round trip.
    if not _tagged(envelope.args) and not _tagged(envelope.kwargs):
        return envelope.args, envelope.kwargs
    args, kwargs = _kombu_loads(json.dumps([envelope.args, envelope.kwargs]))
    return args, kwargs


def _shown(value: Any) -> str:
    # What Flower and the worker's logs show of the arguments. Celery's own saferepr walks
    # the arguments in Python for every message (about a tenth of a release's CPU); the
    # builtin repr is C, and arguments are JSON values whose repr is short and safe.
    text = repr(value)
    return text if len(text) <= ARGS_REPR_LIMIT else text[:ARGS_REPR_LIMIT - 3] + "..."


def _release_options(envelope: ScheduleEnvelope, release: Release, now: dt.datetime
                     ) -> tuple[list[Any], dict[str, Any], dict[str, Any]]:
    """The arguments *envelope*'s task is sent with for *release*, and its send options."""
    options = dict(envelope.options)
    options.pop("task_id", None)  # sent as the task id
    headers = dict(options.pop("headers", None) or {})
    headers[HEADER] = release.header()
    if release.not_before_ms > now.timestamp() * 1000:
        # sent ahead of its due time: the worker holds it until then, as for Celery's own eta
        options["eta"] = dt.datetime.fromtimestamp(release.not_before_ms / 1000, dt.timezone.utc)
    expires = options.pop("expires", None)
    if expires is not None:  # seconds after the scheduled time (see calls.expiry_options)
        options["expires"] = dt.datetime.fromtimestamp(
            (envelope.key.scheduled_ms + expires * 1000) / 1000, dt.timezone.utc)
    args, kwargs = _arguments(envelope)
    # JSON whatever the app's task_serializer says: the scheduler promises that nothing it
    # carries is ever pickled, from the schedule call to the worker.
    return args, kwargs, dict(options, headers=headers, serializer="json", argsrepr=_shown(args),
                              kwargsrepr=_shown(kwargs))


def _route(name: str, options: dict[str, Any]) -> tuple[Any, ...]:
    return (name, options.get("queue"), options.get("exchange"), options.get("routing_key"))


def publish(app: Any, envelope: ScheduleEnvelope, release: Release,
            now: dt.datetime | None = None, producer: Any = None,
            declared: set[tuple[Any, ...]] | None = None, push: RedisPush | None = None,
            context: SendContext | None = None, templates: Templates | None = None,
            retry: bool | None = None) -> None:
    """Send *envelope*'s task to Celery for *release* (through *producer*, if given).

    With *declared* (the routes this producer's connection has declared already), a route
    is declared by its first message only: Celery would declare the queue again for every
    message, a fifth of the CPU of a release. With *push* (a Redis broker), a message it
    takes waits there for the step's pipeline instead of going through kombu, built from
    one of *templates* where it can be. *context* (read once for many messages) saves
    reading the app's state again for each. *retry* overrides ``task_publish_retry``.
    """
    now = now or dt.datetime.now(dt.timezone.utc)
    if producer is not None and push is not None and templates is not None:
        context = context or SendContext.of(app)
        if not context.in_task:
            document = _templated(templates, envelope, release, now)
            if document is not None:
                push.add_prepared(document)
                return
    args, kwargs, sent = _release_options(envelope, release, now)
    if args is not envelope.args or kwargs is not envelope.kwargs:
        push = None  # objects kombu's JSON tags (datetimes, ...): its encoder writes them
    if retry is not None:
        sent["retry"] = retry
    if declared is not None:
        route = _route(envelope.task, sent)
        if route in declared:
            sent["declare"] = []
        else:
            declared.add(route)
    if producer is None or (context := context or SendContext.of(app)).in_task:
        # without a producer of its own, or inside a task (whose ids it inherits): Celery's own
        app.send_task(envelope.task, args=args, kwargs=kwargs, task_id=envelope.task_id,
                      retries=CELERY_RETRIES_EXHAUSTED, producer=producer, **sent)
        return
    if push is None:
        send_release(app, producer, envelope.task, envelope.task_id, args, kwargs, sent,
                     sent_event=context.sent_event)
        return
    message, options = task_message(app, envelope.task, envelope.task_id, args, kwargs, sent, now,
                                    context.sent_event)
    document = push.prepare(envelope.task, message, options)
    if document is None:
        with producer.connection._reraise_as_library_errors():
            app.amqp.send_task_message(producer, envelope.task, message, **options)
        return
    if templates is not None:
        templates.learn(envelope.task, envelope.options, document)
    push.add_prepared(document)


def _templated(templates: Templates, envelope: ScheduleEnvelope, release: Release,
               at: dt.datetime) -> Document | None:
    """*release*'s document sent at *at*, from the template of its task and options; None
    if it has none yet, or cannot have one."""
    if release.not_before_ms > at.timestamp() * 1000 or signals.task_sent.receivers:
        return None  # sent ahead of its due time (its eta is its own), or a deprecated signal
    template = templates.get(envelope.task, envelope.options)
    if template is None:
        return None
    args, kwargs = _arguments(envelope)
    if args is not envelope.args or kwargs is not envelope.kwargs:
        return None  # objects kombu's JSON tags: its encoder writes them
    return template.document(envelope.task_id, args, kwargs, _shown(args), _shown(kwargs),
                             release.header())


def send_release(app: Any, producer: Any, name: str, task_id: str, args: list[Any],
                 kwargs: dict[str, Any], options: dict[str, Any], push: RedisPush | None = None,
                 now: dt.datetime | None = None, *, sent_event: bool | None = None) -> None:
    """Send one released task through *producer*: ``app.send_task`` less what a release ignores.

    The message, its routing and the publish signals are Celery's own (the same calls
    ``send_task`` makes, protocol 2). Left out is what only a caller waiting for the result
    needs: the ``AsyncResult`` and the result backend's ``on_task_call`` (with a Redis result
    backend, a subscription to the task's result channel); the dispatcher reads outcomes
    from its own hook, never from the result backend. On a Redis broker without a result
    backend that is 10-15% of a release's publish CPU (``python -m benchmarks.publish_cost``).
    """
    message, options = task_message(app, name, task_id, args, kwargs, options, now, sent_event)
    if push is not None and push.add(name, message, options):
        return
    with producer.connection._reraise_as_library_errors():
        app.amqp.send_task_message(producer, name, message, **options)


def task_message(app: Any, name: str, task_id: str, args: list[Any], kwargs: dict[str, Any],
                 options: dict[str, Any], now: dt.datetime | None = None,
                 sent_event: bool | None = None) -> tuple[Any, dict[str, Any]]:
    """Celery's message for a released task, and its routed options (as ``send_task`` makes them).

    *sent_event* is the app's ``task_send_sent_event``, read here unless given."""
    amqp = app.amqp
    task_type = app._tasks.get(name)
    if task_type is not None:
        defaults = {key: value for key, value in task_type._get_exec_options().items()
                    if value is not None}
        if defaults:
            options = dict(defaults, **options)
    else:
        options = dict(options)
    time_limit = options.pop("time_limit", None)
    soft_time_limit = options.pop("soft_time_limit", None)
    eta = options.pop("eta", None)
    expires = options.pop("expires", None)
    ignore_result = options.pop("ignore_result", None)
    shadow = options.pop("shadow", None)
    options = amqp.router.route(options, name, args, kwargs, task_type)
    if expires is not None:
        now = now or dt.datetime.now(dt.timezone.utc)
        if not isinstance(expires, dt.datetime):  # the task's own expires=, in seconds
            expires = (eta or now) + dt.timedelta(seconds=float(expires))
        left = (expires - now).total_seconds()
        options["expiration"] = max(0.0, left)
    message = amqp.create_task_message(
        task_id, name, args, kwargs, None, eta, None, None, expires,
        CELERY_RETRIES_EXHAUSTED, None, None, None, app.thread_oid, time_limit,
        soft_time_limit,
        app.conf.task_send_sent_event if sent_event is None else sent_event, None, None,
        shadow, None, origin=_origin(os.getpid()), ignore_result=ignore_result, **options)
    return message, options


class SendContext(NamedTuple):
    """What every message sent from one call needs of the app, read once for all of them:
    each read of ``app.conf`` or of the current task costs microseconds."""

    in_task: bool  # inside a worker's task, whose ids a message inherits
    sent_event: bool  # task_send_sent_event

    @classmethod
    def of(cls, app: Any) -> SendContext:
        return cls(app.current_worker_task is not None, bool(app.conf.task_send_sent_event))


@functools.lru_cache(maxsize=4)
def _origin(pid: int) -> str:
    """The message's ``origin`` (Celery's name for this process), made once per process."""
    return anon_nodename()


