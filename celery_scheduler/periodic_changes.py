"""Periodic entries changed at run time, and the entries in force: pure.

A change (:class:`~celery_scheduler.store.base.EntryChange`, kept in the store) wins over the
app's ``beat_schedule``: an entry paused or deleted at run time fires nothing, whatever the
code says, until it is resumed or reset; an entry added at run time, or whose definition was
replaced, fires by that definition. Resetting an entry forgets its change: it is
``beat_schedule``'s again, or gone if it was only ever added at run time.

A definition is kept as JSON: the entry's task, its schedule (a number of seconds, or
``{"crontab": [minute, hour, day_of_week, day_of_month, month_of_year]}`` or
``{"solar": [event, latitude, longitude]}``), arguments,
Celery options, ``catch_up``, ``jitter``, ``overlap``, ``start`` and ``until``.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
from collections.abc import Collection, Mapping
from typing import Any

from celery.exceptions import ImproperlyConfigured
from celery.schedules import crontab, solar

from celery_scheduler.errors import PeriodicEntryError
from celery_scheduler.periodic import Entry, every
from celery_scheduler.periodic_entries import entry_of
from celery_scheduler.store.records import EntryChange

__all__ = ["definition_of", "entry_of_definition", "in_force"]

logger = logging.getLogger(__name__)


def definition_of(name: str, spec: Mapping[str, Any], known_tasks: Collection[str] | None = None,
                  tz: dt.tzinfo = dt.timezone.utc) -> str:
    """*spec* (a ``beat_schedule`` item) checked and kept as JSON; :class:`PeriodicEntryError`
    names what is wrong. A ``count`` is kept as the ``until`` it comes to (in *tz*, the app's)."""
    entry = entry_of(name, spec, known_tasks, tz)
    schedule: Any
    if isinstance(entry.schedule, crontab):
        schedule = {"crontab": [str(field) for field in entry.schedule.__reduce__()[1][:5]]}
    elif isinstance(entry.schedule, solar):
        schedule = {"solar": list(entry.schedule.__reduce__()[1])}
    else:
        schedule = every(entry.schedule).total_seconds()
    return json.dumps({"task": entry.task, "schedule": schedule, "args": list(entry.args),
                       "kwargs": dict(entry.kwargs), "options": dict(entry.options),
                       "catch_up": entry.catch_up.value, "jitter": entry.jitter_ms / 1000,
                       "overlap": entry.overlap.value, "start": _iso(entry.start_ms),
                       "until": _iso(entry.until_ms)},
                      sort_keys=True)


def _iso(ms: int | None) -> str | None:
    return None if ms is None else dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).isoformat()


@functools.lru_cache(maxsize=4096)
def _crontab(fields: tuple[str, ...]) -> crontab:
    """One crontab object for entries whose fields are the same: Celery's keeps every field
    expanded (a crontab is about 4 KiB), so 100,000 entries of 60 distinct crontabs made one
    each took 436 MB."""
    return crontab(*fields)


def entry_of_definition(name: str, definition: str, known_tasks: Collection[str] | None = None
                        ) -> Entry:
    try:
        spec = json.loads(definition)
        schedule = spec.get("schedule")
        if isinstance(schedule, Mapping) and "solar" in schedule:
            spec["schedule"] = solar(*schedule["solar"])
        elif isinstance(schedule, Mapping):
            spec["schedule"] = _crontab(tuple(schedule["crontab"]))
    except ImproperlyConfigured as exc:  # solar without ephem installed
        raise PeriodicEntryError(name, f"its solar schedule needs ephem: {exc}") from None
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise PeriodicEntryError(name, f"its definition kept at run time is not valid ({exc})") from None
    return entry_of(name, spec, known_tasks)


def in_force(code: list[Entry], changes: Mapping[str, EntryChange],
             known_tasks: Collection[str] | None = None) -> tuple[list[Entry], dict[str, int]]:
    """The entries that fire, and for each one resumed, the time before which nothing fires.

    A definition this process cannot run (its task is not a scheduled task here, say after a
    deploy that removed it) is left out with a warning, not raised: one operator's mistake
    must not stop the dispatchers.
    """
    entries = {entry.name: entry for entry in code}
    floors: dict[str, int] = {}
    for name, change in changes.items():
        if change.definition is not None:
            try:
                entries[name] = entry_of_definition(name, change.definition, known_tasks)
            except PeriodicEntryError as exc:
                logger.warning("periodic entry %r as changed at run time is left out: %s", name, exc)
                entries.pop(name, None)
        if change.paused or change.deleted:
            entries.pop(name, None)
        elif change.resumed_ms:
            floors[name] = change.resumed_ms
    return [entries[name] for name in sorted(entries)], floors

