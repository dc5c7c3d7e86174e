"""The scheduled tasks defined in this process, by Celery task name.

``@scheduled_task`` adds each task it makes (:mod:`celery_scheduler.api`); a dispatcher
releases only the names here that are its app's (any other record is dead-lettered), and
the operator commands find a task by its name.
"""

from __future__ import annotations

from typing import Any

__all__ = ["add", "get", "names", "tasks"]

_TASKS: dict[str, Any] = {}


def add(name: str, task: Any) -> None:
    _TASKS[name] = task


def get(name: str) -> Any:
    """The scheduled task of that name, or None."""
    return _TASKS.get(name)


def tasks(app: Any = None) -> dict[str, Any]:
    """The scheduled tasks by name; with *app*, only those in its task registry."""
    if app is None:
        return dict(_TASKS)
    registry = app.tasks
    return {name: task for name, task in _TASKS.items() if name in registry}


def names(app: Any = None) -> set[str]:
    """The names of :func:`tasks`."""
    return set(tasks(app))
