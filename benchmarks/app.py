"""The Celery app the benchmarks run in dispatchers and workers, configured from the environment.

``bench.record`` is a scheduled task; ``bench.plain`` is the same body as an ordinary Celery
task, for Celery's own ``eta=``; ``bench.longterm`` is it again on celery-longterm-scheduler's
task class, whose ``eta=`` stores the call in Redis until its ``longterm_scheduler`` command
sends it. Both log when their body started (``benchmarks.execlog``);
a released task also logs when the dispatcher published it (a message header this app adds),
so lateness splits into the dispatcher's part and the broker's and worker's part.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from celery import Celery, current_task, signals
from celery_longterm_scheduler import Task as LongtermTask

from benchmarks.execlog import occurrence_of, write_end, write_start
from celery_scheduler import scheduled_task
from celery_scheduler.wire import HEADER, parse_header

REDIS = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/9")
# celery-longterm-scheduler wants a Redis database of its own (one sorted set for all tasks)
LONGTERM_REDIS = os.environ.get("BENCH_LONGTERM_REDIS", "redis://127.0.0.1:6379/10")
EXECLOG = os.environ.get("BENCH_EXECLOG", "")

# the Celery broker: Redis, or RabbitMQ for the scenarios run on both (BENCH_BROKER)
app = Celery("bench", broker=os.environ.get("BENCH_BROKER") or REDIS)
app.conf.update(
    scheduler_kafka_bootstrap_servers=os.environ.get("BENCH_KAFKA", "127.0.0.1:9092"),
    scheduler_kafka_topic=os.environ.get("BENCH_TOPIC", "bench"),
    scheduler_kafka_partitions=int(os.environ.get("BENCH_PARTITIONS", "12")),
    scheduler_cassandra_keyspace=os.environ.get("BENCH_KEYSPACE", "bench"),
    # BENCH_RELEASE_ETA=1 measures the eta mode (not the default) in any scenario
    scheduler_release_eta=os.environ.get("BENCH_RELEASE_ETA") == "1",
    # BENCH_INGEST_LINGER=0 measures the ingest loop without its linger
    # BENCH_RELEASE_AHEAD=0 measures releases sent by the engine thread as it marks them
    scheduler_release_ahead_seconds=float(os.environ.get("BENCH_RELEASE_AHEAD", "0.5")),
    scheduler_ingest_linger_seconds=float(os.environ.get("BENCH_INGEST_LINGER", "1.0")),
    task_default_queue=os.environ.get("BENCH_QUEUE", "bench"),
    worker_prefetch_multiplier=int(os.environ.get("BENCH_PREFETCH", "4")),
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    worker_enable_remote_control=False,
    longterm_scheduler_backend=LONGTERM_REDIS,
)
if os.environ.get("BENCH_ETA_TASK_LIMIT"):  # Celery's worker_eta_task_limit, for the eta mode
    app.conf.worker_eta_task_limit = int(os.environ["BENCH_ETA_TASK_LIMIT"])
if os.environ.get("BENCH_LEASE"):  # the package's default leases unless a scenario says
    app.conf.scheduler_lease_seconds = float(os.environ["BENCH_LEASE"])
if os.environ.get("BENCH_VISIBILITY_TIMEOUT"):
    app.conf.broker_transport_options = {"visibility_timeout": float(os.environ["BENCH_VISIBILITY_TIMEOUT"])}


def sequence_key(ordering_id: str, seq: int, *args: Any, **kwargs: Any) -> str:
    return f"s{seq}"


RELEASED_HEADER = "bench_released"


TICK = "bench.tick"


@signals.before_task_publish.connect
def _stamp_release(headers: dict[str, Any] | None = None, **_: Any) -> None:
    # a release of the dispatcher's, or a periodic run sent by any system (celery beat too)
    if headers is not None and (HEADER in headers or headers.get("task") == TICK):
        headers[RELEASED_HEADER] = time.time()


def body(ordering_id: str, seq: int, at: float, sleep: float = 0.0) -> None:
    """Log the start (*at* is the scheduled time), then work for *sleep* seconds."""
    request = current_task.request if current_task else None
    released = getattr(request, RELEASED_HEADER, None) if request is not None else None
    write_start(EXECLOG, ordering_id, seq, at, released if isinstance(released, float) else None)
    if sleep:
        time.sleep(sleep)
        write_end(EXECLOG, ordering_id, seq)


@app.task(name="bench.record")
def record(ordering_id: str, seq: int, at: float, sleep: float = 0.0) -> None:
    body(ordering_id, seq, at, sleep)


# A peer's workers (BENCH_PLAIN_WORKER=1) are Celery as it comes: no @scheduled_task is
# imported there, so none of the package's worker hooks (outcome reports, the Redis client
# kombu shares) is installed in them.
if os.environ.get("BENCH_PLAIN_WORKER") != "1":
    record = scheduled_task(  # type: ignore[assignment]  # the scheduled task in its place
        ordering_id="ordering_id", uniqueness_key=sequence_key)(record)


@app.task(name="bench.plain")
def plain(ordering_id: str, seq: int, at: float, sleep: float = 0.0) -> None:
    body(ordering_id, seq, at, sleep)


@app.task(name="bench.longterm", base=LongtermTask)
def longterm(ordering_id: str, seq: int, at: float, sleep: float = 0.0) -> None:
    body(ordering_id, seq, at, sleep)


@app.task(name=TICK, bind=True)
def tick(self: Any, name: str, at: float | None = None) -> None:
    """A run of periodic entry *name*: logged under the entry, its occurrence's minute as seq
    (a dispatcher's release names its occurrence; celery beat's runs are told by when they
    were sent; runs queued by hand before their minute, for the workers' floor, carry it)."""
    published = getattr(self.request, RELEASED_HEADER, None)
    sent = published if isinstance(published, float) else time.time()
    release = parse_header(getattr(self.request, HEADER, None))
    if at is None:
        at = release.key.scheduled_ms / 1000 if release is not None else occurrence_of(sent)
    write_start(EXECLOG, name, int(at // 60), at, sent)


# BENCH_PERIODIC=N: N entries of bench.tick, every minute (BENCH_PERIODIC_HOUR=H: once a day at
# H:00 instead, so that none fires while memory is sampled), for the dispatchers
# (scheduler_periodic), celery beat and redbeat (BENCH_REDBEAT=1: its keys named after the
# stack, so that the stack's clean-up deletes them)
PERIODIC = int(os.environ.get("BENCH_PERIODIC", "0"))
if PERIODIC:
    from celery.schedules import crontab

    from celery_scheduler import periodic_tasks

    hour = os.environ.get("BENCH_PERIODIC_HOUR")
    # one schedule object for every entry, as a settings module that builds them in a loop does
    when = crontab(minute=0, hour=int(hour)) if hour else crontab()
    app.conf.beat_schedule = {f"p{i}": {"task": TICK, "schedule": when, "args": [f"p{i}"]}
                              for i in range(PERIODIC)}
    app.conf.scheduler_periodic = True
    if os.environ.get("BENCH_PERIODIC_AHEAD"):  # scheduler_periodic_ahead_seconds
        app.conf.scheduler_periodic_ahead_seconds = float(os.environ["BENCH_PERIODIC_AHEAD"])
    app.conf.redbeat_redis_url = REDIS
    app.conf.redbeat_key_prefix = f"redbeat:{os.environ.get('BENCH_TOPIC', 'bench')}:"
    # redbeat's lock is held for five of beat's longest sleeps (by default 5 x 300 s): a
    # beat set up to stand in for another wakes every 5 s and holds the lock 25 s
    app.conf.beat_max_loop_interval = 5
    app.conf.redbeat_lock_timeout = 25
    if os.environ.get("BENCH_PLAIN_WORKER") != "1":
        periodic_tasks.install(app)


@signals.worker_ready.connect
def _ready(**_: Any) -> None:
    # the harness waits for this file rather than for a log line at INFO level
    marker = os.environ.get("BENCH_READY_FILE")
    if marker:
        Path(marker).touch()


def rq_record(ordering_id: str, seq: int, at: float) -> None:
    """The same body as an RQ job."""
    body(ordering_id, seq, at)
