"""Scheduled tasks for dispatcher tests; each execution appends start/end lines to a log.

The log (``CELERY_SCHEDULER_TEST_EXECLOG``) is the independent record the tests check:
which keys ran, when, in which process, and whether runs of one ordering id overlapped.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery

from celery_scheduler import scheduled_task
from celery_scheduler.eta import DurableEtaTask

REDIS_URL = os.environ.get("CELERY_SCHEDULER_TEST_REDIS", "redis://127.0.0.1:6379")
EXECLOG = os.environ.get("CELERY_SCHEDULER_TEST_EXECLOG", "")

# The broker is Redis unless a test runs the dispatcher on another (RabbitMQ): nothing of
# the scheduler itself needs Redis.
BROKER = os.environ.get("CELERY_SCHEDULER_TEST_BROKER") or f"{REDIS_URL}/1"
app = Celery("dispatching", broker=BROKER,
             backend=f"{REDIS_URL}/2" if BROKER.startswith("redis") else None)
if BROKER.startswith("amqp"):
    # RabbitMQ hands a worker up to prefetch-count messages it then holds while it runs a
    # long task; Celery's advice for long tasks keeps them with the workers that are free.
    app.conf.update(worker_prefetch_multiplier=1, task_acks_late=True)
app.conf.update(
    scheduler_kafka_bootstrap_servers=os.environ.get("CELERY_SCHEDULER_TEST_KAFKA", "127.0.0.1:9092"),
    scheduler_kafka_topic=os.environ.get("CELERY_SCHEDULER_TEST_TOPIC", "celery_scheduler_tests"),
    scheduler_kafka_partitions=int(os.environ.get("CELERY_SCHEDULER_TEST_PARTITIONS", "6")),
    scheduler_cassandra_keyspace=os.environ.get("CELERY_SCHEDULER_TEST_KEYSPACE", "celery_scheduler_tests"),
    scheduler_cassandra_port=int(os.environ.get("CELERY_SCHEDULER_TEST_CASSANDRA_PORT", "9042")),
    scheduler_cassandra_consistency="ONE",
    scheduler_startup_timeout=float(os.environ.get("CELERY_SCHEDULER_TEST_STARTUP_TIMEOUT", "120")),
    scheduler_cassandra_serial_consistency="SERIAL",
    scheduler_lease_seconds=float(os.environ.get("CELERY_SCHEDULER_TEST_LEASE", "30")),
    scheduler_partition_lease_seconds=float(os.environ.get("CELERY_SCHEDULER_TEST_PARTITION_LEASE", "6")),
    scheduler_retry_backoff=0.2,
    scheduler_retry_backoff_max=1.0,
    scheduler_max_attempts=3,
    scheduler_on_exhausted=os.environ.get("CELERY_SCHEDULER_TEST_ON_EXHAUSTED", "skip"),
    scheduler_release_eta=os.environ.get("CELERY_SCHEDULER_TEST_RELEASE_ETA") == "1",
    scheduler_release_ahead_seconds=float(os.environ.get("CELERY_SCHEDULER_TEST_RELEASE_AHEAD", "0.5")),
    task_default_queue=os.environ.get("CELERY_SCHEDULER_TEST_QUEUE", "dispatching"),
    # Celery reads this once, when the app first publishes: it cannot be changed later.
    # Workers keep accepting JSON only, whatever it is.
    task_serializer=os.environ.get("CELERY_SCHEDULER_TEST_TASK_SERIALIZER", "json"),
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
if os.environ.get("CELERY_SCHEDULER_TEST_VISIBILITY_TIMEOUT"):
    # Redis gives an unacknowledged message to another worker after this long
    app.conf.broker_transport_options = {
        "visibility_timeout": float(os.environ["CELERY_SCHEDULER_TEST_VISIBILITY_TIMEOUT"])}
if os.environ.get("CELERY_SCHEDULER_TEST_SIGNING_SECRET"):
    app.conf.scheduler_signing_keys = {"k1": os.environ["CELERY_SCHEDULER_TEST_SIGNING_SECRET"]}
    app.conf.scheduler_signing_key_id = "k1"


def log(event: str, ordering_id: str, seq: int, **extra: object) -> None:
    line = json.dumps({"event": event, "o": ordering_id, "seq": seq, "t": time.time(),
                       "pid": os.getpid(), **extra})
    with open(EXECLOG, "a") as handle:  # one short append: atomic on Linux
        handle.write(line + "\n")


def unique_seq(ordering_id: str, seq: int, *args: object, **kwargs: object) -> str:
    return f"seq-{seq}"


@scheduled_task(ordering_id="ordering_id", uniqueness_key=unique_seq)
@app.task(name="dispatching.record")
def record(ordering_id: str, seq: int, duration: float = 0.0, scheduled_for: float = 0.0) -> int:
    # eta: the due time a release sent ahead of it carries (Celery's eta header), else None
    log("start", ordering_id, seq, scheduled_for=scheduled_for, eta=app.current_task.request.eta)
    if duration:
        time.sleep(duration)
    log("end", ordering_id, seq)
    return seq


def fail_first(ordering_id: str, seq: int, failures: int) -> int:
    attempt = redis.Redis.from_url(f"{REDIS_URL}/3").incr(f"flaky:{EXECLOG}:{ordering_id}:{seq}")
    log("start", ordering_id, seq, attempt=attempt)
    if attempt <= failures:
        log("end", ordering_id, seq, failed=True)
        raise RuntimeError(f"planned failure {attempt} of {failures}")
    log("end", ordering_id, seq)
    return attempt


@scheduled_task(ordering_id="ordering_id", uniqueness_key=unique_seq)
@app.task(name="dispatching.flaky")
def flaky(ordering_id: str, seq: int, failures: int) -> int:
    return fail_first(ordering_id, seq, failures)


@scheduled_task(ordering_id="ordering_id", uniqueness_key=unique_seq)
@app.task(name="dispatching.autoretry", autoretry_for=(RuntimeError,), max_retries=5,
          default_retry_delay=0)
def autoretry(ordering_id: str, seq: int, failures: int) -> int:
    return fail_first(ordering_id, seq, failures)


def hostile_unique(ordering_id: str, text: str, *args: object, **kwargs: object) -> str:
    return f"u-{text}"


@scheduled_task(ordering_id="ordering_id", uniqueness_key=hostile_unique,
                max_attempts=1)
@app.task(name="dispatching.fail_with")
def fail_with(ordering_id: str, text: str) -> None:
    """Fails at once, its error the text it was given (the console's escaping tests)."""
    raise RuntimeError(text)


@app.task(name="dispatching.eta_record", base=DurableEtaTask)
def eta_record(name: str, seq: int, scheduled_for: float = 0.0) -> int:
    """A task written for plain Celery (``apply_async(countdown=...)``), in the drop-in eta mode."""
    log("start", name, seq, scheduled_for=scheduled_for)
    log("end", name, seq)
    return seq


# A periodic entry, fired by the dispatchers when CELERY_SCHEDULER_TEST_PERIODIC is set (its
# value: the entry's interval in seconds). Its task is a plain Celery task, made a scheduled
# task by periodic_tasks.install as a user's app would.
TICK_SECONDS = float(os.environ.get("CELERY_SCHEDULER_TEST_PERIODIC") or 0)


@app.task(name="dispatching.tick")
def tick() -> None:
    log("start", "periodic:tick", 0, task_id=app.current_task.request.id)
    log("end", "periodic:tick", 0)


if TICK_SECONDS:
    from celery_scheduler import periodic_tasks

    app.conf.scheduler_periodic = True
    app.conf.beat_schedule = {"tick": {"task": "dispatching.tick", "schedule": TICK_SECONDS}}
    periodic_tasks.install(app)


if os.environ.get("CELERY_SCHEDULER_TEST_DIE_ON_DELIVERY"):
    # The dispatcher dies the moment Kafka acknowledged a delayed message, before it could
    # record it: the message must be produced again (at least once), never lost.
    from celery_scheduler.tasklog import delivery as _delivery

    _acknowledged = _delivery.KafkaDelivery._acknowledged

    def _die_on_acknowledgement(self: Any, release: Any, started: int) -> Any:
        report = _acknowledged(self, release, started)

        def acknowledged(error: Any, message: Any) -> None:
            if error is None:
                os._exit(9)
            report(error, message)
        return acknowledged

    _delivery.KafkaDelivery._acknowledged = _die_on_acknowledgement  # type: ignore[method-assign]

if os.environ.get("CELERY_SCHEDULER_TEST_WITHOUT_REDIS_FIX"):
    # The control of test_redis_worker_fix: the worker as Celery and kombu alone leave it.
    from celery import signals

    from celery_scheduler.worker import REDIS_FIX_UID

    signals.worker_init.disconnect(dispatch_uid=REDIS_FIX_UID)
