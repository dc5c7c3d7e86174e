"""The checks of a schedule call that every kind of call shares (tasks and delayed messages):
its time, its Celery options, and the default uniqueness key. Each raises an error of the
package's tree that names the offending value and what to do."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

from celery_scheduler.envelope import RetryPolicy, encode_arguments, option_problem
from celery_scheduler.errors import NotSerializableError, ScheduleError, ScheduleTimeError
from celery_scheduler.keys import MAX_MS, TaskKey, check_key_part, to_epoch_ms

__all__ = ["call_digest", "check_options", "check_retry", "deadline_ms", "expiry_options",
           "scheduled_ms_of"]


def check_options(options: Mapping[str, Any]) -> dict[str, Any]:
    for name, value in options.items():
        problem = option_problem(name, value)
        if problem is not None:
            raise ScheduleError(problem)
    checked = dict(options)
    if "task_id" in checked:
        check_key_part(checked["task_id"], "task id")
    if "headers" in checked:
        checked["headers"] = encode_arguments((), checked["headers"])[1]
    return checked


def expiry_options(options: Mapping[str, Any] | None, default: Any, scheduled_ms: int | None,
                   timezone: dt.tzinfo = dt.timezone.utc) -> Mapping[str, Any] | None:
    """*options* with ``expires`` (or, without one, the task's own *default*, Celery's
    ``Task.expires``) as seconds after the scheduled time, which is how the task keeps it.

    A number or a timedelta is that already; a datetime (a naive one in *timezone*, the
    app's, as for ``at``) is made one when the call's *scheduled_ms* is known (a batch's
    shared options take numbers only). A time before the scheduled time or a negative number
    raise :class:`ScheduleTimeError`.
    """
    expires = options.get("expires") if options else None
    if expires is None:
        if default is None:
            return options
        expires = default
    if isinstance(expires, dt.timedelta):
        expires = expires.total_seconds()
    elif isinstance(expires, dt.datetime) and scheduled_ms is not None:
        seconds = (to_epoch_ms(expires, timezone) - scheduled_ms) / 1000
        if seconds < 0:
            raise ScheduleTimeError(
                f"expires={expires.isoformat()} is {-seconds:g}s before the task's scheduled "
                "time: it would expire before it is due; give a later time")
        expires = seconds
    if isinstance(expires, (int, float)) and not isinstance(expires, bool) and expires < 0:
        raise ScheduleTimeError(f"expires={expires!r} is negative: give the seconds after the "
                                "scheduled time by which the task must have been released")
    return {**(options or {}), "expires": expires}


def deadline_ms(scheduled_ms: int, options: Mapping[str, Any]) -> int | None:
    """When a task kept with *options* expires (epoch ms), or None if it never does."""
    expires = options.get("expires")
    return None if expires is None else scheduled_ms + int(expires * 1000)


def check_retry(retry: Any) -> None:
    """Refuse a ``retry=`` that is neither None nor a RetryPolicy."""
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise ScheduleError(f"retry must be a RetryPolicy, got {retry!r:.200}")


def scheduled_ms_of(at: Any, countdown: Any, current: int, timezone: Any,
                    grace_seconds: float) -> int:
    """The scheduled time (epoch ms) of a call given *at* (a datetime; a naive one is in
    *timezone*) or *countdown* (seconds or a timedelta from *current*); ScheduleTimeError if
    it is not exactly one of them, not usable, or further in the past than the grace window.
    """
    if (at is None) == (countdown is None):
        raise ScheduleTimeError("give exactly one of at= (a datetime) and countdown= (a delay)")
    if at is not None:
        scheduled = to_epoch_ms(at, timezone)
    else:
        seconds = countdown.total_seconds() if isinstance(countdown, dt.timedelta) else countdown
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise ScheduleTimeError(
                f"delay must be seconds or a timedelta, got {type(countdown).__name__} {countdown!r}"
            )
        latest = (MAX_MS - current) / 1000
        if not (math.isfinite(seconds) and -current / 1000 <= seconds <= latest):
            raise ScheduleTimeError(
                f"delay {countdown!r} is not a usable number of seconds; the latest time a task "
                f"key holds is 9999-12-31, {latest:.0f}s from now"
            )
        scheduled = current + int(seconds * 1000)
    if scheduled < current - grace_seconds * 1000:
        raise ScheduleTimeError(
            f"scheduled time {TaskKey('', scheduled, '').scheduled_at.isoformat()} is "
            f"{(current - scheduled) / 1000:.1f}s in the past, beyond the grace window "
            f"of {grace_seconds}s (scheduler_grace_seconds); check the clock or "
            "the timezone of a naive datetime"
        )
    return scheduled


def call_digest(task: str, args: list[Any], kwargs: dict[str, Any]) -> str:
    # The default uniqueness key: the same call scheduled twice for the same time is the
    # same task key (idempotent re-enqueueing), while different calls never collide.
    canonical = json.dumps([task, args, kwargs], sort_keys=True, separators=(",", ":"),
                           ensure_ascii=False)
    try:
        data = canonical.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise NotSerializableError(
            f"the arguments of task {task} cannot be encoded as UTF-8 JSON ({exc}); a string "
            "holds a lone surrogate, such as text decoded with errors='surrogateescape': "
            "pass valid text, or bytes") from None
    return "call-" + hashlib.sha256(data).hexdigest()[:32]
