from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.namespaces import fresh_name
from tests.services import RABBITMQ, REPO, require
from tests.waiting import wait_until


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    return require("kafka")


@pytest.fixture(scope="session")
def cassandra_contact() -> str:
    return require("cassandra")


@pytest.fixture(scope="session")
def redis_url() -> str:
    require("redis")
    return os.environ.get("CELERY_SCHEDULER_TEST_REDIS", "redis://127.0.0.1:6379")


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    require("rabbitmq")
    return RABBITMQ


@pytest.fixture
def broker_url(redis_url: str) -> str:
    """The Celery broker of the dispatcher tests' app: Redis, unless a test module says."""
    return f"{redis_url}/1"


@pytest.fixture
def unique_name() -> str:
    """A name no other test run uses: topics, keyspaces and queues are made per test."""
    return fresh_name()


class WorkerProcess:
    """A real ``celery worker`` subprocess, stopped (and its log shown on failure) at teardown."""

    def __init__(self, process: subprocess.Popen[bytes], log_path: Path) -> None:
        self.process = process
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL: where nothing is checked after it, this saves a RabbitMQ worker's slow exit."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


@pytest.fixture
def start_worker(
    redis_url: str, tmp_path: Path
) -> Iterator[Callable[..., WorkerProcess]]:
    """Factory: start a Celery worker for app module *app* on *queue*; wait until it is ready."""
    workers: list[WorkerProcess] = []

    def start(app: str, queue: str, *extra: str, env: dict[str, str] | None = None) -> WorkerProcess:
        log_path = tmp_path / f"worker-{len(workers)}.log"
        environment = {**os.environ, "CELERY_SCHEDULER_TEST_QUEUE": queue, **(env or {})}
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", app, "worker", "--loglevel=INFO",
                 "--pool=solo", "--concurrency=1", "--without-gossip", "--without-mingle",
                 "--without-heartbeat",
                 "-Q", queue, "-n", f"{queue}-{len(workers)}@%h", *extra],
                cwd=REPO, env=environment, stdout=log, stderr=subprocess.STDOUT,
            )
        worker = WorkerProcess(process, log_path)
        workers.append(worker)
        def ready() -> bool:
            if process.poll() is not None:
                pytest.fail(f"celery worker exited with {process.returncode}:\n{worker.log()}")
            return "ready." in worker.log()

        wait_until(ready, 60, lambda: f"the celery worker ready:\n{worker.log()}", every=0.2)
        return worker

    yield start
    for worker in workers:
        worker.stop()
