"""procrastinate, the PostgreSQL peer: a database per stack, its workers, and deferring jobs.

procrastinate keeps jobs in one PostgreSQL table; a worker fetches the oldest due job whose
lock (our ordering id) has no earlier job waiting or running, and learns of new jobs by
LISTEN/NOTIFY or, for jobs deferred with ``schedule_at``, by polling (every 5 s by default).
``queueing_lock`` refuses a second waiting job with the same key (our uniqueness key).

Each stack gets a database of its own (named like the stack), with procrastinate's schema
applied; it is dropped when the stack ends. The job body writes the same execution-log line
as the Celery tasks (``benchmarks.execlog``), so lateness and order are measured alike.

Workers run ``python -m procrastinate --app=benchmarks.peers_procrastinate.app worker`` and
find their database through ``BENCH_PG_DATABASE``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import procrastinate

from benchmarks.execlog import write_start
from benchmarks.harness import POSTGRES, ProcessFailed, Stack, log

__all__ = ["Deferrer", "app", "database", "retry_stalled", "worker"]

TASK = "bench.procrastinate"
QUEUE = "bench"  # one queue per database, so one name serves every stack


def conninfo(database: str) -> str:
    return f"{POSTGRES}/{database}"


# the app the workers run; its database comes from the stack's environment
app = procrastinate.App(connector=procrastinate.PsycopgConnector(
    conninfo=conninfo(os.environ.get("BENCH_PG_DATABASE", "postgres"))))


@app.task(name=TASK, queue=QUEUE)
def record(ordering_id: str, seq: int, at: float, sleep: float = 0.0) -> None:
    """The benchmark body: log the start (*at* is the due time), then work for *sleep* seconds."""
    write_start(os.environ.get("BENCH_EXECLOG", ""), ordering_id, seq, at)
    if sleep:
        time.sleep(sleep)


def _admin(statement: str, name: str) -> None:
    """Run *statement* with *name* as its one identifier, outside a transaction."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(conninfo("postgres"), autocommit=True) as connection:
        connection.execute(sql.SQL(statement).format(sql.Identifier(name)))


@contextmanager
def database(s: Stack, synchronous_commit: bool = True) -> Iterator[str]:
    """A database named after the stack with procrastinate's schema; its conninfo.

    Without *synchronous_commit*, a commit returns before its WAL is flushed (PostgreSQL's
    ``synchronous_commit = off``, set on the database, so for every connection to it): a crash
    may lose the last commits, as Cassandra's periodic commit log may lose the last writes of
    celery_scheduler's tasks; the durability closest to ours. The stack's processes are
    stopped before the database is dropped.
    """
    started = time.monotonic()
    _admin("CREATE DATABASE {}", s.name)
    if not synchronous_commit:
        _admin("ALTER DATABASE {} SET synchronous_commit = off", s.name)
    try:
        schema = procrastinate.App(connector=procrastinate.SyncPsycopgConnector(conninfo=conninfo(s.name)))
        with schema.open():
            schema.schema_manager.apply_schema()
        s.env["BENCH_PG_DATABASE"] = s.name
        log(f"procrastinate database {s.name} ready after {time.monotonic() - started:.1f}s")
        yield conninfo(s.name)
    finally:
        for process in s.processes:
            s.stop(process)
        _admin("DROP DATABASE IF EXISTS {} WITH (FORCE)", s.name)


def _workers(database: str) -> int:
    import psycopg

    with psycopg.connect(conninfo(database)) as connection:
        row = connection.execute("SELECT count(*) FROM procrastinate_workers").fetchone()
        return int(row[0]) if row else 0


def worker(s: Stack, concurrency: int = 1, wait: bool = True) -> Any:
    """A procrastinate worker on the stack's database (one job at a time by default)."""
    before = _workers(s.name)
    process = s.spawn("worker", [sys.executable, "-m", "procrastinate", f"--app={__name__}.app",
                                 "worker", f"--concurrency={concurrency}",
                                 f"--name={s.name}-{len(s.processes)}", f"--queues={QUEUE}"])
    if wait:
        deadline = time.monotonic() + 60
        while _workers(s.name) <= before:  # a worker registers itself once it runs
            if process.poll() is not None or time.monotonic() > deadline:
                raise ProcessFailed(f"procrastinate worker did not start: {s.log_of(process)[-3000:]}")
            time.sleep(0.1)
    return process


def retry_stalled(database: str) -> int:
    """procrastinate's documented recipe for a killed worker's jobs, run once: retry every job
    of a worker whose heartbeat is older than 30 s (its default). Returns the jobs retried."""

    async def once() -> int:
        retrier = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo(database)))
        async with retrier.open_async():
            stalled = list(await retrier.job_manager.get_stalled_jobs())
            for job in stalled:
                await retrier.job_manager.retry_job(job)
            return len(stalled)

    return asyncio.run(once())


@dataclass
class Deferrer:
    """Defers benchmark jobs into one database from this process (synchronous connector)."""

    database: str

    def __post_init__(self) -> None:
        self.app = procrastinate.App(connector=procrastinate.SyncPsycopgConnector(
            conninfo=conninfo(self.database)))
        self.app.open()
        self.refused = 0  # defers refused by a queueing lock

    def defer(self, ordering_id: str, seq: int, due: float, *, lock: str | None = None,
              queueing_lock: str | None = None, sleep: float = 0.0) -> None:
        job = self.app.configure_task(name=TASK, queue=QUEUE, lock=lock, queueing_lock=queueing_lock,
                                      schedule_at=dt.datetime.fromtimestamp(due, dt.timezone.utc))
        try:
            job.defer(ordering_id=ordering_id, seq=seq, at=due, sleep=sleep)
        except procrastinate.exceptions.AlreadyEnqueued:
            self.refused += 1

    def defer_many(self, jobs: list[tuple[str, int, float]], lock: bool) -> None:
        """Defer (ordering id, seq, due) jobs in one statement; *lock*: the ordering id is the lock."""
        from procrastinate.jobs import Job

        self.app.job_manager.batch_defer_jobs([
            Job(id=None, queue=QUEUE, lock=oid if lock else None, queueing_lock=None, task_name=TASK,
                task_kwargs={"ordering_id": oid, "seq": seq, "at": due},
                scheduled_at=dt.datetime.fromtimestamp(due, dt.timezone.utc))
            for oid, seq, due in jobs])

    def analyze(self) -> None:
        """Refresh the planner's statistics of the jobs table, as autovacuum would within a
        minute of a bulk insert: the fetch query's plan depends on them."""
        import psycopg

        with psycopg.connect(conninfo(self.database), autocommit=True) as connection:
            connection.execute("ANALYZE procrastinate_jobs")

    def close(self) -> None:
        self.app.close()
