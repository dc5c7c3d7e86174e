"""The ``celery_scheduler`` fixture beside Celery's own pytest fixtures (an embedded worker)."""

from __future__ import annotations

from typing import Any

from celery_scheduler import scheduled_task
from celery_scheduler.testing import SchedulerTesting

# celery_scheduler comes from its pytest11 entry point, as in a user's project
pytest_plugins = ["celery.contrib.pytest"]


def test_a_scheduled_task_hands_work_to_celerys_embedded_worker(
        celery_app: Any, celery_worker: Any, celery_scheduler: SchedulerTesting) -> None:
    @celery_app.task(name="plugin.deliver")
    def deliver(customer_id: str) -> str:
        return f"delivered to {customer_id}"

    @scheduled_task(ordering_id="customer_id")
    @celery_app.task(name="plugin.remind")
    def remind(customer_id: str) -> str:
        return str(deliver.delay(customer_id).id)

    celery_worker.reload()  # the worker learns the tasks defined in the test
    handle = remind.schedule_in(60, "c1")
    assert celery_scheduler.advance(59) == []
    [run] = celery_scheduler.advance(1)  # the scheduled task runs here, at its time ...
    assert run.key == handle.key and run.succeeded
    # ... and what it sent went through the app's broker to the embedded worker
    assert celery_app.AsyncResult(run.result.get()).get(timeout=10) == "delivered to c1"
