"""The tasks an app's ``beat_schedule`` names, made scheduled tasks, so that the dispatchers
can fire its entries (``scheduler_periodic = True``; see :mod:`celery_scheduler.periodic`).

::

    # proj/celery.py
    app = Celery("proj")
    app.conf.beat_schedule = {"nightly-report": {"task": "proj.tasks.report",
                                                 "schedule": crontab(hour=3, minute=0)}}
    celery_scheduler.periodic_tasks.install(app)

A worker then runs only the current release of an occurrence and reports how it ended, as
for any task decorated with ``@scheduled_task``; the dispatchers refuse to start with an
entry whose task is neither.
"""

from __future__ import annotations

from typing import Any

from celery_scheduler import registry
from celery_scheduler.api import ScheduledTask, scheduled_task
from celery_scheduler.periodic_entries import app_entries

__all__ = ["install"]


def install(app: Any) -> None:
    """Make the tasks *app*'s ``beat_schedule`` names scheduled tasks in every process that
    finalizes the app (workers, dispatchers, web processes). A task already decorated with
    ``@scheduled_task`` is left as it is."""

    def make_scheduled(sender: Any = None, **_: Any) -> None:
        registered = registry.names(app)
        for entry in app_entries(app):
            task = app.tasks[entry.task]
            if entry.task not in registered and not isinstance(task, ScheduledTask):
                scheduled_task(task)
                registered.add(entry.task)

    app.on_after_finalize.connect(make_scheduled, weak=False)
