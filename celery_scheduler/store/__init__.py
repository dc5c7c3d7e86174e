"""The schedule store: pending tasks in time buckets, and the status of every task key.

:class:`~celery_scheduler.store.base.ScheduleStore` is the interface; ``cassandra`` is the
real implementation and ``memory`` the in-process one for unit tests.
"""

from celery_scheduler.store.base import ScheduleStore, State, StoredTask, TaskStatus

__all__ = ["ScheduleStore", "State", "StoredTask", "TaskStatus"]
