"""Real processes for the scenarios: a scheduler topic/keyspace/queue of its own, dispatchers,
Celery and RQ workers as subprocesses, and clean-up of everything a run created.

Names are unique per stack (``bench_<hex>``), so runs never touch another user's topics,
keyspaces or queues on the shared services; Redis keys of a stack all contain its name.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis
from confluent_kafka import Consumer, KafkaException, TopicPartition

from benchmarks import execlog
from benchmarks.execlog import Start

__all__ = ["KAFKA", "POSTGRES", "RABBITMQ_URL", "REDIS_URL", "REPO", "Stack", "committed_and_end",
           "stack"]

REPO = Path(__file__).resolve().parent.parent
KAFKA = os.environ.get("BENCH_KAFKA", "127.0.0.1:9092")
# One Redis database for the benchmarks' Celery broker and RQ queues; every key a run
# creates names the run's stack, and is deleted at the end.
REDIS_URL = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/9")
# RabbitMQ, for the scenarios run on both brokers (scripts/services up rabbitmq)
RABBITMQ_URL = os.environ.get("BENCH_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672//")
# The PostgreSQL server (no database named) of procrastinate, the one peer that needs it; each
# stack of that peer creates a database named after itself, and drops it at the end.
POSTGRES = os.environ.get("BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432")
APP = "benchmarks.app"


def log(message: str) -> None:
    """Progress on stderr, so a slow step on a busy machine shows where the time went."""
    print(f"[bench] {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


class ProcessFailed(RuntimeError):
    """A dispatcher or worker exited, or did not get ready, during a scenario."""


class Stack:
    """One scheduler topic, keyspace and Celery queue, with its processes and execution log."""

    def __init__(self, tmp: Path, *, partitions: int = 12, env: dict[str, str] | None = None,
                 broker: str | None = None) -> None:
        self.name = f"bench_{uuid.uuid4().hex[:10]}"
        self.tmp = tmp
        self.execlog = tmp / f"{self.name}.execlog"
        self.env = {**os.environ, "BENCH_TOPIC": self.name, "BENCH_KEYSPACE": self.name,
                    "BENCH_QUEUE": self.name, "BENCH_EXECLOG": str(self.execlog),
                    "BENCH_PARTITIONS": str(partitions), "BENCH_REDIS": REDIS_URL,
                    "BENCH_KAFKA": KAFKA, **(env or {})}
        # the Celery broker of this stack's dispatchers and workers (None: Redis)
        self.broker = broker
        if broker is not None:
            self.env["BENCH_BROKER"] = broker
        self.partitions = partitions
        self.processes: list[subprocess.Popen[bytes]] = []
        self.logs: dict[int, Path] = {}
        self.initialised = False
        self._client: Any = None
        self._previous_client: Any = None

    # --- the scheduler's own objects ----------------------------------------------------

    def init(self) -> None:
        """Create the topic and keyspace with the package's own `scheduler init`."""
        started = time.monotonic()
        result = subprocess.run([sys.executable, "-m", "celery", "-A", APP, "scheduler", "init",
                                 "--partitions", str(self.partitions)],
                                cwd=REPO, env=self.env, capture_output=True, text=True, timeout=180)
        self.initialised = True
        if result.returncode != 0:
            raise ProcessFailed(f"scheduler init failed: {result.stderr[-2000:]}")
        log(f"scheduler init {self.name} took {time.monotonic() - started:.1f}s")

    def use_client(self) -> Any:
        """Point this process's schedule calls at this stack's topic; return the app module."""
        from benchmarks import app
        from celery_scheduler.client import SchedulerClient, set_client
        from celery_scheduler.config import get_settings

        settings = get_settings(app.app).replace(kafka_topic=self.name, cassandra_keyspace=self.name)
        self._client = SchedulerClient(settings)
        self._previous_client = set_client(app.app, self._client)
        return app

    def store(self) -> Any:
        """The package's Cassandra store for this keyspace (closed by the caller)."""
        from benchmarks import app
        from celery_scheduler.config import get_settings
        from celery_scheduler.store import open_store

        return open_store(get_settings(app.app).replace(kafka_topic=self.name, cassandra_keyspace=self.name))

    # --- processes -------------------------------------------------------------------------

    def spawn(self, kind: str, argv: list[str], env: dict[str, str] | None = None
              ) -> subprocess.Popen[bytes]:
        path = self.tmp / f"{self.name}-{kind}-{len(self.processes)}.log"
        with path.open("wb") as out:
            process = subprocess.Popen(argv, cwd=REPO, env={**self.env, **(env or {})},
                                       stdout=out, stderr=subprocess.STDOUT)
        self.processes.append(process)
        self.logs[process.pid] = path
        return process

    def log_of(self, process: subprocess.Popen[bytes]) -> str:
        return self.logs[process.pid].read_text(errors="replace")

    def _wait(self, process: subprocess.Popen[bytes], ready: Any, what: str, timeout: float) -> None:
        started = time.monotonic()
        deadline = started + timeout
        while not ready():
            if process.poll() is not None:
                raise ProcessFailed(f"{what} exited with {process.returncode}: "
                                    f"{self.log_of(process)[-3000:]}")
            if time.monotonic() > deadline:
                raise ProcessFailed(f"{what} not ready after {timeout}s: {self.log_of(process)[-3000:]}")
            time.sleep(0.1)
        log(f"{what} ready after {time.monotonic() - started:.1f}s")

    def dispatcher(self, wait: bool = True, env: dict[str, str] | None = None
                   ) -> subprocess.Popen[bytes]:
        process = self.spawn("dispatcher", [sys.executable, "-m", "celery", "-A", APP, "scheduler",
                                            "dispatch", "--loglevel", "INFO"], env)
        if wait:
            self._wait(process, lambda: "leased partition" in self.log_of(process), "dispatcher", 120)
        return process

    def worker(self, pool: str = "solo", env: dict[str, str] | None = None, wait: bool = True,
               plain: bool = False) -> subprocess.Popen[bytes]:
        """A Celery worker of the bench app on this stack's queue; *plain* for a peer's (no
        @scheduled_task imported, so none of the package's worker hooks)."""
        if self.broker is not None and self.broker.startswith("amqp") and pool == "solo":
            pool = "threads"  # one task at a time too; solo stalls on RabbitMQ (README: Brokers)
        index = len(self.processes)
        marker = self.tmp / f"{self.name}-worker-{index}.ready"
        process = self.spawn("worker", [
            sys.executable, "-m", "celery", "-A", APP, "worker", "--loglevel=WARNING", f"--pool={pool}",
            "--concurrency=1", "--without-gossip", "--without-mingle", "--without-heartbeat",
            "-Q", self.name, "-n", f"{self.name}-{index}@%h"],
            {"BENCH_READY_FILE": str(marker), **({"BENCH_PLAIN_WORKER": "1"} if plain else {}),
             **(env or {})})
        if wait:
            self._wait(process, marker.exists, "celery worker", 120)
        return process

    def rq_worker(self) -> subprocess.Popen[bytes]:
        """An RQ SimpleWorker (runs jobs in its own process) with RQ's own scheduler."""
        name = f"{self.name}-rq-{len(self.processes)}"
        process = self.spawn("rqworker", [
            str(Path(sys.executable).parent / "rq"), "worker", "--with-scheduler", "--worker-class",
            "rq.worker.SimpleWorker", "--url", REDIS_URL, "--name", name, "--logging_level", "WARNING",
            self.name])
        connection = redis.Redis.from_url(REDIS_URL)
        self._wait(process, lambda: connection.exists(f"rq:worker:{name}") == 1, "rq worker", 60)
        return process

    def stop(self, process: subprocess.Popen[bytes], timeout: float = 30) -> None:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def check_alive(self) -> None:
        for process in self.processes:
            code = process.poll()
            if code is not None and code not in (0, -signal.SIGKILL, -signal.SIGTERM):
                raise ProcessFailed(f"{self.logs[process.pid].stem} exited with {code}: "
                                    f"{self.log_of(process)[-3000:]}")

    # --- the execution log -----------------------------------------------------------------

    def starts(self) -> list[Start]:
        return execlog.read(self.execlog)

    def wait_for_starts(self, count: int, timeout: float, distinct: bool = False) -> bool:
        """Wait until *count* task bodies started (*distinct*: tasks, not runs); False on timeout."""
        deadline = time.monotonic() + timeout

        def started() -> int:
            if distinct:  # a duplicate run must not end the wait before every task ran
                return len({(x.ordering_id, x.seq) for x in execlog.read(self.execlog)})
            return execlog.count(self.execlog)

        while started() < count:
            if time.monotonic() > deadline:
                return False
            self.check_alive()
            time.sleep(0.2)
        return True

    # --- clean-up --------------------------------------------------------------------------

    def close(self) -> None:
        started = time.monotonic()
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            self.stop(process)
        if self._client is not None:
            from benchmarks import app
            from celery_scheduler.client import set_client

            self._client.close()
            set_client(app.app, self._previous_client)
        if self.initialised:
            from tests.services import drop_scheduler

            drop_scheduler(self.name, self.name)
        clean_redis(self.name)
        if self.broker is not None and self.broker.startswith("amqp"):
            delete_queue(self.broker, self.name)
        with contextlib.suppress(FileNotFoundError):
            self.execlog.unlink()
        log(f"cleaned up {self.name} in {time.monotonic() - started:.1f}s")


def clean_redis(name: str) -> None:
    """Delete every Redis key naming *name*, and its entries in shared kombu/RQ structures."""
    connection = redis.Redis.from_url(REDIS_URL)
    keys = list(connection.scan_iter(match=f"*{name}*", count=1000))
    for start in range(0, len(keys), 500):
        connection.delete(*keys[start:start + 500])
    # kombu keeps unacknowledged messages of every queue in one hash (and an index of it)
    tags = [tag for tag, value in connection.hscan_iter("unacked", count=1000) if name.encode() in value]
    for start in range(0, len(tags), 500):
        connection.hdel("unacked", *tags[start:start + 500])
        connection.zrem("unacked_index", *tags[start:start + 500])
    for shared in ("rq:queues", "rq:workers"):
        members = [m for m in connection.smembers(shared) if name.encode() in m]
        if members:
            connection.srem(shared, *members)


def delete_queue(url: str, name: str) -> None:
    """Delete the RabbitMQ queue *name* (what a scenario left in it goes too)."""
    from benchmarks import app

    with app.app.connection_for_write(url) as connection, contextlib.suppress(Exception):
        connection.default_channel.queue_delete(name)  # type: ignore[attr-defined]


def committed_and_end(topic: str, group: str, partitions: int) -> tuple[int, int]:
    """(offsets the group committed, end offsets), summed over the topic's partitions."""
    consumer = Consumer({"bootstrap.servers": KAFKA, "group.id": group})
    try:
        parts = [TopicPartition(topic, p) for p in range(partitions)]
        for attempt in range(20):
            try:
                committed = sum(max(tp.offset, 0) for tp in consumer.committed(parts, timeout=10))
                break
            except KafkaException as exc:
                # a broker that has just started is still loading its group coordinators
                if not exc.args[0].retriable() or attempt == 19:
                    raise
                time.sleep(0.5)
        end = sum(consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in parts)
        return committed, end
    finally:
        consumer.close()


@contextlib.contextmanager
def stack(tmp: Path, *, init: bool = True, **options: Any) -> Iterator[Stack]:
    """A Stack that is cleaned up however the scenario ends."""
    created = Stack(tmp, **options)
    try:
        if init:
            created.init()
        yield created
    finally:
        created.close()


def dump(value: Any) -> str:
    return json.dumps(value, default=str)
