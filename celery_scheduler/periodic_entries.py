"""Reading periodic entries: each entry of celery beat's ``beat_schedule`` (or of a change
made at run time) checked and turned into an :class:`~celery_scheduler.periodic.Entry`, with
a typed error naming the entry for anything it cannot be."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Collection, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

from celery.schedules import crontab, schedule, solar

from celery_scheduler.calls import check_options
from celery_scheduler.errors import PeriodicEntryError, ScheduleError
from celery_scheduler.keys import MAX_KEY_LENGTH, MAX_MS, to_epoch_ms
from celery_scheduler.periodic import (
    CELERY_KEYS,
    LONGEST_SUFFIX,
    MAX_OCCURRENCES,
    OCCURRENCE_SUFFIX,
    OWN_KEYS,
    PERIODIC_PREFIX,
    CatchUp,
    Entry,
    Overlap,
    every,
    occurrences,
)

__all__ = ["app_entries", "entries", "entry_of"]

_UTC = dt.timezone.utc
_NONE: Mapping[str, Any] = MappingProxyType({})  # an entry's kwargs or options when it has none


def _json(entry: str, what: str, value: Any) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise PeriodicEntryError(entry, f"its {what} must be JSON values ({exc})") from None


def _schedule(entry: str, value: Any, relative: bool) -> schedule | crontab | solar:
    if isinstance(value, (crontab, solar)):
        return value
    if isinstance(value, schedule):
        if every(value).total_seconds() <= 0:
            raise PeriodicEntryError(entry, f"its interval must be positive, got {every(value)}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float, dt.timedelta)):
        raise PeriodicEntryError(
            entry, f"schedule must be seconds, a timedelta, celery.schedules.schedule, "
                   f"crontab or solar, got {type(value).__name__} {value!r:.100}")
    seconds = value.total_seconds() if isinstance(value, dt.timedelta) else float(value)
    if not 0.001 <= seconds < 10 * 365 * 86_400:
        raise PeriodicEntryError(entry, f"its interval must be from 1 ms to 10 years, got {value!r}")
    return schedule(dt.timedelta(seconds=seconds), relative=relative)


def _moment(entry: str, spec: Mapping[str, Any], name: str) -> int | None:
    """The entry's *name* option, an aware datetime (or ISO 8601 text with an offset), in ms."""
    value = spec.get(name)
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise PeriodicEntryError(entry, f"{name!r} is not an ISO 8601 time: {value!r}") from None
    if not isinstance(value, dt.datetime) or value.tzinfo is None:
        raise PeriodicEntryError(entry, f"{name!r} must be an aware datetime (or ISO 8601 with an "
                                        f"offset), got {value!r:.100}")
    return to_epoch_ms(value, _UTC)


Choice = TypeVar("Choice", CatchUp, Overlap)


def _choice(entry: str, spec: Mapping[str, Any], name: str, default: Choice) -> Choice:
    """The entry's *name* option, one of *default*'s enum (the default when absent)."""
    kind = type(default)
    try:
        return kind(spec.get(name, default.value))
    except ValueError:
        raise PeriodicEntryError(entry, f"{name!r} must be one of "
                                        f"{', '.join(c.value for c in kind)}, got "
                                        f"{spec.get(name)!r}") from None


def entry_of(name: Any, spec: Any, known_tasks: Collection[str] | None = None,
             tz: dt.tzinfo = _UTC) -> Entry:
    """Check one ``beat_schedule`` item; :class:`PeriodicEntryError` names what is wrong."""
    if not isinstance(name, str) or not name.strip():
        raise PeriodicEntryError(str(name), "its name must be a non-empty string")
    if OCCURRENCE_SUFFIX.search(name):
        raise PeriodicEntryError(name, "its name must not end in '@' and a time in UTC, as an "
                                       "allow_all entry's occurrences do: rename it")
    if not isinstance(spec, Mapping):
        raise PeriodicEntryError(name, f"it must be a mapping, got {type(spec).__name__}")
    unknown = sorted(set(spec) - CELERY_KEYS - OWN_KEYS)
    if unknown:
        raise PeriodicEntryError(name, f"unknown key(s) {', '.join(map(str, unknown))}; known: "
                                       f"{', '.join(sorted(CELERY_KEYS | OWN_KEYS))}")
    task = spec.get("task")
    if not isinstance(task, str) or not task:
        raise PeriodicEntryError(name, f"'task' must be a task name, got {task!r:.100}")
    if known_tasks is not None and task not in known_tasks:
        raise PeriodicEntryError(name, f"task {task!r} is not registered in this app")
    if "schedule" not in spec:
        raise PeriodicEntryError(name, "it has no 'schedule'")
    relative = spec.get("relative", False)
    if not isinstance(relative, bool):
        raise PeriodicEntryError(name, f"'relative' must be True or False, got {relative!r}")
    args, kwargs, options = spec.get("args", ()), spec.get("kwargs", {}), spec.get("options", {})
    if not isinstance(args, (list, tuple)):
        raise PeriodicEntryError(name, f"'args' must be a list or tuple, got {type(args).__name__}")
    if not isinstance(kwargs, Mapping) or any(not isinstance(k, str) for k in kwargs):
        raise PeriodicEntryError(name, "'kwargs' must be a mapping with string keys")
    if not isinstance(options, Mapping):
        raise PeriodicEntryError(name, f"'options' must be a mapping, got {type(options).__name__}")
    _json(name, "args", list(args))
    _json(name, "kwargs", dict(kwargs))
    _json(name, "options", dict(options))
    try:
        checked_options = check_options(options)
    except ScheduleError as exc:
        raise PeriodicEntryError(name, f"its options: {exc}") from None
    catch_up = _choice(name, spec, "catch_up", CatchUp.LAST)
    overlap = _choice(name, spec, "overlap", Overlap.BUFFER_ALL)
    longest = len(PERIODIC_PREFIX + name) + (LONGEST_SUFFIX if overlap is Overlap.ALLOW_ALL else 0)
    if longest > MAX_KEY_LENGTH:
        raise PeriodicEntryError(name, f"its name is {len(name)} characters long: its runs' ordering "
                                       f"id would be {longest}, over {MAX_KEY_LENGTH}; shorten it")
    start_ms = _moment(name, spec, "start")
    until_ms = _moment(name, spec, "until")
    jitter = spec.get("jitter", 0)
    if isinstance(jitter, dt.timedelta):
        jitter = jitter.total_seconds()
    if isinstance(jitter, bool) or not isinstance(jitter, (int, float)) or not 0 <= jitter <= 86_400:
        raise PeriodicEntryError(name, f"'jitter' must be 0 to 86,400 seconds, got {jitter!r}")
    # a dispatcher holds every entry: the many with no kwargs or options share one empty mapping
    entry = Entry(name, task, _schedule(name, spec["schedule"], relative), tuple(args),
                  dict(kwargs) if kwargs else _NONE, checked_options or _NONE,
                  catch_up, int(jitter * 1000), overlap, start_ms, until_ms)
    count = spec.get("count")
    if count is None:
        return entry
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_OCCURRENCES:
        raise PeriodicEntryError(name, f"'count' must be 1 to {MAX_OCCURRENCES:,}, got {count!r}")
    if start_ms is None:
        raise PeriodicEntryError(name, "'count' needs 'start': the first occurrences from then run")
    # the count-th occurrence from start is the last (a crontab's in the app's timezone)
    found = occurrences(entry, start_ms - 1, MAX_MS, tz, limit=count)
    last = found[count - 1] if len(found) >= count else None
    return dataclasses.replace(entry, until_ms=last if until_ms is None or last is None
                               else min(until_ms, last))


def entries(beat_schedule: Mapping[str, Any], known_tasks: Collection[str] | None = None,
            tz: dt.tzinfo = _UTC) -> list[Entry]:
    """Every entry of *beat_schedule*, checked (all of them before any is returned)."""
    if not isinstance(beat_schedule, Mapping):
        raise PeriodicEntryError("beat_schedule", f"it must be a mapping of entry names to "
                                                  f"entries, got {type(beat_schedule).__name__}")
    return [entry_of(name, spec, known_tasks, tz) for name, spec in beat_schedule.items()]


def app_entries(app: Any) -> list[Entry]:
    """The entries of *app*'s ``beat_schedule`` (``add_periodic_task`` included), checked
    against its tasks."""
    return entries(app.conf.beat_schedule or {}, known_tasks=set(app.tasks), tz=app.timezone)
