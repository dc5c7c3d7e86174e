"""Change the periodic entries at run time, from Python (the CLI and the HTTP API call these).

::

    from celery_scheduler import periodic_admin

    periodic_admin.pause(app, "nightly-report")      # fires nothing until resumed
    periodic_admin.resume(app, "nightly-report")     # from its next occurrence: no catch-up
    periodic_admin.add(app, "sweep", {"task": "proj.tasks.sweep", "schedule": 600})
    periodic_admin.delete(app, "sweep")              # fires nothing, whatever beat_schedule says
    periodic_admin.reset(app, "nightly-report")      # beat_schedule's again

A change is kept in Cassandra and wins over the app's ``beat_schedule`` (see
:mod:`celery_scheduler.periodic_changes`); the dispatcher that fires the entry applies it
within a few seconds (``CHANGES_EVERY_MS``). An unknown entry, a malformed definition or a
task that is not a scheduled task raises :class:`PeriodicEntryError` and changes nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from celery_scheduler import registry
from celery_scheduler.audit import note
from celery_scheduler.client import get_client
from celery_scheduler.errors import PeriodicEntryError
from celery_scheduler.periodic_changes import definition_of
from celery_scheduler.periodic_entries import app_entries
from celery_scheduler.store.records import EntryChange

__all__ = ["add", "changes", "delete", "pause", "reset", "resume", "schedule_from_text"]


def changes(app: Any) -> dict[str, EntryChange]:
    """Every entry changed at run time, by name."""
    return get_client(app).store.entry_changes()


def _change(app: Any, name: str, **fields: Any) -> EntryChange:
    client = get_client(app)
    current = client.store.entry_changes()
    known = {entry.name for entry in app_entries(app)} | {
        n for n, change in current.items() if change.definition is not None}
    if name not in known:
        raise PeriodicEntryError(name, f"there is no such entry (beat_schedule has "
                                       f"{', '.join(sorted(known)) or 'none'}); add it first")
    change = dataclasses.replace(current.get(name, EntryChange(name)), **fields,
                                 updated_ms=client.clock())
    client.store.change_entry(change)
    return change


def _noted(app: Any, action: str, name: str, by: str | None) -> None:
    note(get_client(app), f"periodic {action}", name, by=by)


def pause(app: Any, name: str, by: str | None = None) -> EntryChange:
    """Entry *name* fires nothing until resumed (what falls due meanwhile is skipped)."""
    change = _change(app, name, paused=True)
    _noted(app, "pause", name, by)
    return change


def resume(app: Any, name: str, by: str | None = None) -> EntryChange:
    """Entry *name* fires again, from its first occurrence after now."""
    change = _change(app, name, paused=False, resumed_ms=get_client(app).clock())
    _noted(app, "resume", name, by)
    return change


def delete(app: Any, name: str, by: str | None = None) -> EntryChange:
    """Entry *name* never fires again, whatever beat_schedule says (until :func:`reset`)."""
    change = _change(app, name, deleted=True)
    _noted(app, "delete", name, by)
    return change


def schedule_from_text(name: str, every: float | None = None, crontab: str | None = None,
                       solar: str | None = None) -> Any:
    """The schedule of entry *name* as an operator types it (the CLI, the HTTP API): exactly
    one of *every* (seconds), *crontab* (``"MINUTE HOUR DAY_OF_MONTH MONTH DAY_OF_WEEK"``)
    and *solar* (``"EVENT LATITUDE LONGITUDE"``, Celery's solar events; needs ``ephem``).
    :class:`PeriodicEntryError` says what is wrong."""
    from celery.exceptions import ImproperlyConfigured
    from celery.schedules import crontab as crontab_of
    from celery.schedules import solar as solar_of

    given = [what for what, value in (("every", every), ("crontab", crontab), ("solar", solar))
             if value is not None]
    if len(given) != 1:
        raise PeriodicEntryError(name, f"give exactly one of every, crontab and solar, got "
                                       f"{', '.join(given) or 'none'}")
    if crontab is not None:
        fields = crontab.split()
        if len(fields) != 5:
            raise PeriodicEntryError(name, f"crontab {crontab!r} is not five fields: MINUTE "
                                           "HOUR DAY_OF_MONTH MONTH DAY_OF_WEEK")
        minute, hour, day_of_month, month_of_year, day_of_week = fields
        try:
            return crontab_of(minute, hour, day_of_week, day_of_month, month_of_year)
        except ValueError as exc:
            raise PeriodicEntryError(name, f"crontab {crontab!r}: {exc}") from None
    if solar is not None:
        fields = solar.split()
        try:
            event: Any = fields[0]  # checked by solar itself
            latitude, longitude = float(fields[1]), float(fields[2])
            if len(fields) != 3:
                raise ValueError(f"{len(fields)} fields")
            return solar_of(event, latitude, longitude)
        except (IndexError, ValueError) as exc:
            raise PeriodicEntryError(name, f"solar {solar!r} is not EVENT LATITUDE LONGITUDE "
                                           f"(e.g. 'sunrise 48.85 2.35'): {exc}") from None
        except ImproperlyConfigured as exc:
            raise PeriodicEntryError(name, f"solar schedules need ephem: {exc}") from None
    return every


def add(app: Any, name: str, spec: Mapping[str, Any], by: str | None = None) -> EntryChange:
    """Add entry *name*, or replace its definition, with *spec* (a beat_schedule item whose
    schedule is a number of seconds, a timedelta, a crontab or a solar event). Its task must
    be a scheduled task (see :mod:`celery_scheduler.periodic_tasks`)."""
    client = get_client(app)
    scheduled = registry.names(app)
    task = spec.get("task") if isinstance(spec, Mapping) else None
    if isinstance(task, str) and task in app.tasks and task not in scheduled:
        raise PeriodicEntryError(name, f"task {task!r} is not a scheduled task; decorate it with "
                                       "@scheduled_task, or name it in beat_schedule and call "
                                       "celery_scheduler.periodic_tasks.install(app)")
    definition = definition_of(name, spec, known_tasks=scheduled, tz=app.timezone)
    change = EntryChange(name, definition=definition, updated_ms=client.clock())
    client.store.change_entry(change)
    note(client, "periodic add", name, definition, by=by)
    return change


def reset(app: Any, name: str, by: str | None = None) -> None:
    """Forget what was changed of entry *name* at run time: it is beat_schedule's again, from
    its first occurrence after now (what fell due while it was paused or deleted does not
    run), or gone, if it was only added at run time."""
    client = get_client(app)
    if name in {entry.name for entry in app_entries(app)}:
        now = client.clock()
        client.store.change_entry(EntryChange(name, resumed_ms=now, updated_ms=now))
    else:
        client.store.forget_entry_change(name)
    note(client, "periodic reset", name, by=by)
