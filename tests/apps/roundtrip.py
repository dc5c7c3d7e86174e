"""A plain Celery app on the local Redis broker, for checking that a real worker runs tasks."""

from __future__ import annotations

import os

from celery import Celery

REDIS_URL = os.environ.get("CELERY_SCHEDULER_TEST_REDIS", "redis://127.0.0.1:6379")

app = Celery("roundtrip", broker=f"{REDIS_URL}/1", backend=f"{REDIS_URL}/2")
app.conf.update(
    task_default_queue=os.environ.get("CELERY_SCHEDULER_TEST_QUEUE", "roundtrip"),
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(name="roundtrip.add")
def add(x: int, y: int) -> dict[str, int]:
    return {"sum": x + y, "pid": os.getpid()}
