"""A real worker on RabbitMQ warns at start about settings that make released tasks wait."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.rabbitmq

SOLO = "this solo worker prefetches"
SOLO_ON_RABBITMQ = "the solo pool on RabbitMQ"


def warnings_of(worker) -> str:
    # worker_ready is sent just before "ready." is logged; the warning lines precede it
    deadline = time.monotonic() + 5
    while "ready." not in worker.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    return "\n".join(line for line in worker.log().splitlines() if "celery_scheduler:" in line)


def test_a_worker_with_celerys_defaults_is_told_what_to_change(start_worker, rabbitmq_url: str,
                                                                 unique_name: str) -> None:
    worker = start_worker("tests.apps.dispatching", unique_name, "--concurrency=2",
                          env={"CELERY_SCHEDULER_TEST_BROKER": rabbitmq_url})
    logged = warnings_of(worker)
    assert SOLO in logged and "prefetches 2 messages" in logged, worker.log()
    assert SOLO_ON_RABBITMQ in logged, worker.log()
    worker.kill()  # a worker on RabbitMQ takes about 10 s to exit after SIGTERM


def test_a_worker_set_up_as_the_readme_says_starts_without_warnings(start_worker, rabbitmq_url: str,
                                                                       unique_name: str) -> None:
    worker = start_worker("tests.apps.dispatching", unique_name, "--pool=threads",
                          env={"CELERY_SCHEDULER_TEST_BROKER": rabbitmq_url})
    assert "ready." in worker.log()
    assert warnings_of(worker) == "", worker.log()
    worker.kill()


def test_a_worker_in_eta_mode_without_an_eta_limit_is_told_to_set_one(
        start_worker, rabbitmq_url: str, unique_name: str) -> None:
    worker = start_worker("tests.apps.dispatching", unique_name, "--pool=threads",
                          env={"CELERY_SCHEDULER_TEST_BROKER": rabbitmq_url,
                               "CELERY_SCHEDULER_TEST_RELEASE_ETA": "1"})
    logged = warnings_of(worker)
    assert "worker_eta_task_limit is not set" in logged, worker.log()
    assert SOLO not in logged and SOLO_ON_RABBITMQ not in logged and "supervisor" not in logged
    worker.kill()
