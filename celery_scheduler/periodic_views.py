"""What operators see of the periodic entries (the CLI, the HTTP API, the console): each entry
of the app's ``beat_schedule``, the partition that fires it, the occurrence it fired last and
how that run stands, and its next occurrences."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from celery_scheduler import registry
from celery_scheduler.client import SchedulerClient
from celery_scheduler.partitioner import partition_for
from celery_scheduler.periodic import key, next_occurrence
from celery_scheduler.periodic_changes import entry_of_definition
from celery_scheduler.periodic_entries import app_entries

__all__ = ["EntryView", "entry_views"]


@dataclass(frozen=True)
class EntryView:
    name: str
    task: str
    schedule: str
    partition: int
    catch_up: str
    scheduled_task: bool  # False: dispatchers refuse to start (see periodic_tasks.install)
    source: str  # "beat_schedule", "run time", or "beat_schedule, replaced at run time"
    state: str  # "active", "paused" or "deleted" (run-time changes)
    last_fired: dt.datetime | None  # the latest occurrence written
    last_state: str | None  # its task's state (None: unknown, or its status expired)
    last_error: str | None
    next: list[dt.datetime]  # the next occurrences after the later of now and last_fired


def _utc(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)


def entry_views(app: Any, client: SchedulerClient, upcoming: int = 3,
                now_ms: int | None = None) -> list[EntryView]:
    """Every entry of *app*'s ``beat_schedule`` and every one added at run time, as its
    dispatcher sees it."""
    code = {entry.name: entry for entry in app_entries(app)}
    changes = client.store.entry_changes()
    by_name = dict(code)
    sources = dict.fromkeys(code, "beat_schedule")
    for name, change in changes.items():
        if change.definition is not None:
            by_name[name] = entry_of_definition(name, change.definition)
            sources[name] = "beat_schedule, replaced at run time" if name in code else "run time"
    entries = [by_name[name] for name in sorted(by_name)]
    count = client.task_log.partitions()
    homes = {entry.name: partition_for(entry.ordering_id, count) for entry in entries}
    fired = {partition: client.store.last_fired(partition) for partition in set(homes.values())}
    lasts = {entry.name: fired[homes[entry.name]].get(entry.name) for entry in entries}
    last_keys = {}
    for entry in entries:
        last = lasts[entry.name]
        if last is not None:
            last_keys[entry.name] = key(entry, last, lambda ordering_id: partition_for(ordering_id, count))
    statuses = dict(zip(last_keys, client.store.statuses(list(last_keys.values())), strict=True))
    now = client.clock() if now_ms is None else now_ms
    scheduled = registry.names(app)
    views = []
    for entry in entries:
        changed = changes.get(entry.name)
        state = ("active" if changed is None else "deleted" if changed.deleted else
                 "paused" if changed.paused else "active")
        last = lasts[entry.name]
        after = now if last is None else max(now, last)
        nexts = []
        for _ in range(upcoming if state == "active" else 0):
            upcoming_ms = next_occurrence(entry, after, app.timezone)
            if upcoming_ms is None:  # ended (until, count)
                break
            nexts.append(_utc(upcoming_ms))
            after = upcoming_ms
        status = statuses.get(entry.name)
        views.append(EntryView(entry.name, entry.task, str(entry.schedule), homes[entry.name],
                               entry.catch_up.value, entry.task in scheduled,
                               sources[entry.name], state,
                               None if last is None else _utc(last),
                               None if status is None else status.state.value,
                               None if status is None else status.last_error, nexts))
    return views
