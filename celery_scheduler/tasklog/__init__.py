"""The task log: where schedule and cancel records are appended, keyed by ordering id.

:class:`~celery_scheduler.tasklog.base.TaskLog` is the interface; ``kafka`` is the real
implementation and ``memory`` the in-process one for unit tests and the testing helper.
"""

from celery_scheduler.tasklog.base import Position, TaskLog

__all__ = ["Position", "TaskLog"]
