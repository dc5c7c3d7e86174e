"""Fixtures that run real dispatchers and workers as subprocesses on a topic of their own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from celery_scheduler.client import SchedulerClient, set_client
from celery_scheduler.config import get_settings
from tests.integration.namespaces import Namespaces, schedulers
from tests.services import REPO
from tests.waiting import wait_until

APP = "tests.apps.dispatching"


@dataclass
class Scheduler:
    """One test's scheduler: its topic/keyspace/queue, processes and execution log.

    Processes run ``python -m celery`` of *python* in *cwd* (by default this interpreter, in
    the checkout).
    """

    env: dict[str, str]
    execlog: Path
    tmp: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: dict[int, Path] = field(default_factory=dict)
    python: str = sys.executable
    cwd: Path = REPO

    def cli(self, *args: str, timeout: float = 120, answer: str = "") -> subprocess.CompletedProcess[str]:
        """Run a scheduler command; a question it asks reads *answer* (never the terminal)."""
        return subprocess.run([self.python, "-m", "celery", "-A", APP, "scheduler", *args],
                              cwd=self.cwd, env=self.env, capture_output=True, text=True,
                              timeout=timeout, input=answer)

    def _spawn(self, name: str, argv: list[str], extra_env: dict[str, str] | None = None
               ) -> subprocess.Popen[bytes]:
        path = self.tmp / f"{name}-{len(self.processes)}.log"
        with path.open("wb") as out:
            process = subprocess.Popen(argv, cwd=self.cwd, env={**self.env, **(extra_env or {})},
                                       stdout=out, stderr=subprocess.STDOUT)
        self.processes.append(process)
        self.logs[process.pid] = path
        return process

    def log_of(self, process: subprocess.Popen[bytes]) -> str:
        return self.logs[process.pid].read_text(errors="replace")

    def wait_for_log(self, process: subprocess.Popen[bytes], text: str, timeout: float = 60) -> None:
        def seen() -> bool:
            if process.poll() is not None and text not in self.log_of(process):
                pytest.fail(f"process exited with {process.returncode}:\n{self.log_of(process)}")
            return text in self.log_of(process)

        wait_until(seen, timeout, lambda: f"{text!r} in the log:\n{self.log_of(process)[-5000:]}")

    def dispatcher(self, *extra: str, wait: bool = True, extra_env: dict[str, str] | None = None
                   ) -> subprocess.Popen[bytes]:
        process = self._spawn("dispatcher", [self.python, "-m", "celery", "-A", APP, "scheduler",
                                             "dispatch", "--loglevel", "INFO", *extra], extra_env)
        if wait:
            self.wait_for_log(process, "leased partition")
        return process

    def worker(self, *extra: str) -> subprocess.Popen[bytes]:
        queue = self.env["CELERY_SCHEDULER_TEST_QUEUE"]
        # one task at a time per process; on RabbitMQ solo workers take messages only now and
        # then (README: Brokers), threads ones do not
        broker = (self.env.get("CELERY_SCHEDULER_TEST_BROKER")
                  or self.env.get("CELERY_SCHEDULER_CHAOS_BROKER", ""))
        pool = "threads" if broker.startswith("amqp") else "solo"
        process = self._spawn("worker", [
            # solo takes its prefetch count from --concurrency (by default the CPU count): one
            # message, or a worker busy with a long task holds another that a free one could run
            self.python, "-m", "celery", "-A", APP, "worker", "--loglevel=INFO", f"--pool={pool}",
            "--concurrency=1", "--without-gossip", "--without-mingle", "--without-heartbeat", "-Q", queue,
            "-n", f"{queue}-{len(self.processes)}@%h", *extra])
        self.wait_for_log(process, "ready.")
        return process

    def executions(self) -> list[dict[str, Any]]:
        if not self.execlog.exists():
            return []
        text = self.execlog.read_text()
        # a line being written as it is read is not whole yet: read at the next look
        lines = text.splitlines() if text.endswith("\n") else text.splitlines()[:-1]
        return [json.loads(line) for line in lines if line]

    def starts(self) -> list[dict[str, Any]]:
        return [e for e in self.executions() if e["event"] == "start"]

    def log_tails(self, tail: int = 3000) -> str:
        """The last *tail* characters of every process's log, for a failure's message."""
        return "\n".join(f"--- {p.args[-1] if p.args else p.pid}\n{self.log_of(p)[-tail:]}"
                         for p in self.processes)

    def wait_for_starts(self, count: int, timeout: float = 60, what: str = "executions") -> None:
        def shown() -> str:
            return f"{count} {what} ({len(self.starts())} so far)\n{self.log_tails()}"

        wait_until(lambda: len(self.starts()) >= count, timeout, shown)

    def stop_all(self, *, kill_workers: bool = False) -> None:
        """Stop every process; *kill_workers*: SIGKILL the workers instead of a warm shutdown.

        A worker of the test app on RabbitMQ takes about 9 s to exit after SIGTERM or SIGQUIT
        (its event loop sleeps on); where nothing is checked afterwards, such as a test's
        teardown, killing it saves that.
        """
        for process in self.processes:
            if process.poll() is None:
                worker = list(process.args[5:6]) == ["worker"]
                process.send_signal(signal.SIGKILL if kill_workers and worker else signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


@dataclass
class AppProcesses(Scheduler):
    """A dispatcher and a worker of another app than the test app (an example, an installed one)."""

    app: str = ""

    def celery(self, *args: str, ready: str) -> None:
        process = self._spawn(args[0], [self.python, "-m", "celery", "-A", self.app, *args])
        self.wait_for_log(process, ready)

    def init(self) -> None:
        result = self.cli("init")
        assert result.returncode == 0, result.stderr

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.python, "-m", "celery", "-A", self.app, "scheduler", *args],
                              cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=timeout)

    def start(self, name: str) -> None:
        self.celery("scheduler", "dispatch", "--loglevel", "INFO", ready="leased partition")
        self.celery("worker", "--loglevel=INFO", "--pool=solo", "--concurrency=1", "--without-gossip",
                    "--without-mingle", "--without-heartbeat", "-n", f"{name}@%h", ready="ready.")


@pytest.fixture(scope="session")
def namespaces(kafka_bootstrap: str, cassandra_contact: str) -> Iterator[Namespaces]:
    """The test app's topics and keyspaces, made a test ahead (see tests.integration.namespaces)."""
    made = schedulers(APP, kafka_bootstrap)
    yield made
    made.close()


@pytest.fixture
def scheduler(namespaces: Namespaces, kafka_bootstrap: str, redis_url: str, broker_url: str,
              tmp_path: Path) -> Iterator[Scheduler]:
    """The test app's scheduler on a topic, keyspace and queue of its own (made by
    ``scheduler init``), for the test to start dispatchers and workers of."""
    name = namespaces.take()
    execlog = tmp_path / "executions.jsonl"
    env = {**os.environ,
           "CELERY_SCHEDULER_TEST_TOPIC": name, "CELERY_SCHEDULER_TEST_KEYSPACE": name,
           "CELERY_SCHEDULER_TEST_QUEUE": name, "CELERY_SCHEDULER_TEST_EXECLOG": str(execlog),
           "CELERY_SCHEDULER_TEST_KAFKA": kafka_bootstrap, "CELERY_SCHEDULER_TEST_BROKER": broker_url}
    scheduler = Scheduler(env, execlog, tmp_path)
    yield scheduler
    scheduler.stop_all(kill_workers=True)
    namespaces.drop(name)


@pytest.fixture
def schedule(scheduler: Scheduler) -> Iterator[Callable[..., Any]]:
    """The test app's tasks, scheduling onto this test's topic from the test process."""
    from tests.apps import dispatching

    settings = get_settings(dispatching.app).replace(
        kafka_topic=scheduler.env["CELERY_SCHEDULER_TEST_TOPIC"],
        cassandra_keyspace=scheduler.env["CELERY_SCHEDULER_TEST_KEYSPACE"])
    client = SchedulerClient(settings)
    previous = set_client(dispatching.app, client)
    yield dispatching
    client.close()
    set_client(dispatching.app, previous)
