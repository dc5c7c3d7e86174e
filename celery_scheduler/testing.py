"""Unit-test application code that schedules tasks, without Kafka or Cassandra.

::

    from celery_scheduler.testing import scheduler_testing

    def test_signup_schedules_a_reminder():
        with scheduler_testing(app) as scheduler:
            signup("customer-42")
            [task] = scheduler.pending()
            assert task.task == "proj.tasks.send_reminder"
            assert task.key.ordering_id == "customer-42"
            scheduler.run_due()          # runs it eagerly, like task.apply()

Inside the block every schedule and cancel call of *app* goes to an in-memory task log
that validates and encodes exactly as the real one does, so bad input raises the same
errors it would in production.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from kombu.utils.json import loads as kombu_loads

from celery_scheduler.client import SchedulerClient, now_ms, set_client
from celery_scheduler.config import get_settings
from celery_scheduler.envelope import CancelEnvelope, ScheduleEnvelope, decode
from celery_scheduler.keys import TaskKey
from celery_scheduler.store.memory import MemoryScheduleStore
from celery_scheduler.tasklog.memory import MemoryTaskLog

__all__ = ["SchedulerRecorder", "scheduler_testing"]


class SchedulerRecorder:
    """What the application scheduled and cancelled, with a way to run what is due."""

    def __init__(self, app: Any, task_log: MemoryTaskLog, store: MemoryScheduleStore) -> None:
        self.app = app
        self.task_log = task_log
        self.store = store
        self._finished: set[TaskKey] = set()

    def records(self) -> list[ScheduleEnvelope | CancelEnvelope]:
        """Every schedule and cancel record, in the order each partition received them."""
        return [decode(value) for _, value in self.task_log.records()]

    def pending(self) -> list[ScheduleEnvelope]:
        """Tasks that would still run: latest record per key, minus cancels and finished ones."""
        latest: dict[TaskKey, ScheduleEnvelope] = {}
        for record in self.records():
            if isinstance(record, CancelEnvelope):
                latest.pop(record.key, None)
            elif record.key not in self._finished:
                latest[record.key] = record
        return sorted(latest.values(), key=lambda e: (e.key.scheduled_ms, e.key.ordering_id))

    def cancelled(self) -> list[TaskKey]:
        return [r.key for r in self.records() if isinstance(r, CancelEnvelope)]

    def run_due(self, until_ms: int | None = None) -> list[Any]:
        """Run pending tasks due by *until_ms* (default: all) eagerly, in time order.

        Returns the Celery ``EagerResult`` of each; arguments arrive decoded as a worker
        would see them.
        """
        results = []
        for envelope in self.pending():
            if until_ms is not None and envelope.key.scheduled_ms > until_ms:
                break
            args, kwargs = kombu_loads(json.dumps([envelope.args, envelope.kwargs]))  # type: ignore[no-untyped-call]
            task = self.app.tasks[envelope.task]
            results.append(task.apply(args, kwargs, task_id=envelope.key.task_id))
            self._finished.add(envelope.key)
        return results

    def run_due_now(self) -> list[Any]:
        """Run the pending tasks whose time has come."""
        return self.run_due(now_ms())


@contextlib.contextmanager
def scheduler_testing(app: Any, partitions: int = 12) -> Iterator[SchedulerRecorder]:
    """Route *app*'s schedule calls to memory for the duration of the block."""
    settings = get_settings(app)
    task_log = MemoryTaskLog(partitions)
    store = MemoryScheduleStore(settings.bucket_seconds)
    previous = set_client(app, SchedulerClient(settings, task_log=task_log, store=store))
    try:
        yield SchedulerRecorder(app, task_log, store)
    finally:
        set_client(app, previous)
