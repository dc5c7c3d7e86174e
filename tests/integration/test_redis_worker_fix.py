"""A real worker holding eta messages on Redis lives through a Redis restart.

Celery 5.7 with kombu 5.7 ends such a worker ("Unrecoverable error: AttributeError") when its
broker goes away (see ``celery_scheduler.redis_worker_fix``). The eta mode sends every release
ahead as an eta message, so its workers nearly always hold some. Each test runs a Redis of its
own, restarted without persistence as after a crash; the second test is the control: the
same worker without the fix exits, so the first one shows the fix, not luck.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from celery import Celery

from tests.conftest import WorkerProcess
from tests.integration.private_redis import PrivateRedis
from tests.waiting import wait_until

pytestmark = [pytest.mark.redis]

HELD = 3



def holding_worker_through_a_restart(start_worker: Callable[..., WorkerProcess], private_redis: PrivateRedis,
                                     queue: str, execlog: Path, **env: str) -> tuple[WorkerProcess, Celery]:
    """Start a worker, give it HELD eta messages a minute ahead, and restart its Redis."""
    worker = start_worker("tests.apps.dispatching", queue,
                          env={"CELERY_SCHEDULER_TEST_REDIS": private_redis.base_url,
                               "CELERY_SCHEDULER_TEST_EXECLOG": str(execlog), **env})
    sender = Celery("sender", broker=f"{private_redis.base_url}/1", set_as_current=False)
    for seq in range(HELD):
        sender.send_task("dispatching.record", ("held", seq), countdown=60, queue=queue)
    wait_until(lambda: worker.log().count("] received") == HELD, 20, worker.log)
    private_redis.stop()
    # the worker sees the connection fail (Celery's consumer says so), or exits without the fix
    wait_until(lambda: "Connection to broker lost" in worker.log() or worker.process.poll() is not None,
               30, worker.log)
    private_redis.start()
    return worker, sender


def test_a_worker_holding_eta_messages_survives_a_redis_restart_and_takes_new_tasks(
        start_worker: Callable[..., WorkerProcess], private_redis: PrivateRedis, unique_name: str,
        tmp_path: Path) -> None:
    execlog = tmp_path / "executions.jsonl"
    worker, sender = holding_worker_through_a_restart(start_worker, private_redis, unique_name, execlog)
    wait_until(lambda: worker.log().count("Connected to redis") >= 2, 30, worker.log)
    sender.send_task("dispatching.record", ("after", 0), queue=unique_name)
    wait_until(lambda: execlog.exists() and any(
        json.loads(line)["o"] == "after" for line in execlog.read_text().splitlines()), 30, worker.log)
    assert worker.process.poll() is None, worker.log()
    assert "Unrecoverable error" not in worker.log()


def test_the_same_worker_without_the_fix_exits(start_worker: Callable[..., WorkerProcess],
                                               private_redis: PrivateRedis, unique_name: str,
                                               tmp_path: Path) -> None:
    worker, _ = holding_worker_through_a_restart(
        start_worker, private_redis, unique_name, tmp_path / "executions.jsonl",
        CELERY_SCHEDULER_TEST_WITHOUT_REDIS_FIX="1")
    # if this fails, kombu fixed the bug: redis_worker_fix can go
    wait_until(lambda: worker.process.poll() is not None, 30, worker.log)
    assert "Unrecoverable error" in worker.log() and "hostname" in worker.log(), worker.log()
