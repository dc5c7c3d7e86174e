"""celery_scheduler: durable, distributed, ordered scheduling of one-off Celery tasks.

A scheduled call goes to Kafka (keyed by ordering id), a dispatcher persists it in a
time-bucketed Cassandra schedule and, when it is due, releases it to ordinary Celery
workers one at a time per ordering id; ``schedule_message`` has it produce a message to a
Kafka topic instead.
"""

from celery_scheduler.api import (
    ScheduledTask,
    ScheduleHandle,
    as_scheduled,
    constant,
    flush,
    scheduled_task,
)
from celery_scheduler.batch import Call, ScheduledBatch
from celery_scheduler.envelope import RetryPolicy
from celery_scheduler.keys import TaskKey
from celery_scheduler.messages import schedule_message
from celery_scheduler.store.base import State, TaskStatus

__version__ = "0.1.0.dev0"

__all__ = [
    "Call",
    "RetryPolicy",
    "ScheduleHandle",
    "ScheduledBatch",
    "ScheduledTask",
    "State",
    "TaskKey",
    "TaskStatus",
    "__version__",
    "as_scheduled",
    "constant",
    "flush",
    "schedule_message",
    "scheduled_task",
]
