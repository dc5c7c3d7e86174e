"""Warnings a worker logs when it starts with settings that make released tasks wait.

The scheduler releases a task when it is due and one at a time per ordering id, so a
released task that sits in a worker's prefetch buffer, or in a queue no worker takes from,
is late by as long as it waits there. These Celery settings cause that without any error:

- **the solo pool's prefetch count.** Celery sets a worker's prefetch count to
  ``--concurrency`` times ``worker_prefetch_multiplier``, and ``--concurrency`` defaults to the
  number of CPUs even with ``--pool=solo``, which runs one task at a time. A solo worker
  busy with a long task then holds messages that a free worker could have run.
- **the solo pool on RabbitMQ.** After a RabbitMQ restart a solo worker reconnects but
  takes messages only now and then, for tens of seconds, where prefork and threads workers
  take them at once. In the quick chaos run on RabbitMQ, solo workers started tasks 69 s
  late at the median (p99 93 s), threads workers 0.03 s (p99 22 s); README: Brokers.
- **eta mode without an eta limit.** With ``scheduler_release_eta`` on, releases come ahead of
  their due time as Celery eta messages, which Celery does not count against the prefetch
  count: without ``worker_eta_task_limit`` a worker whose pool is busy with long tasks takes
  every one sent its way, tasks a free worker could have run.

(A worker on Redis that holds eta messages used to exit when the broker went away, a
Celery 5.7 and kombu 5.7 bug: ``redis_worker_fix`` keeps it alive, so that needs no advice.)

:func:`advice` is a pure function of the worker's settings; :func:`warn_on_ready` is the
``worker_ready`` signal handler that logs what it returns.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from celery_scheduler.config import get_settings

__all__ = ["WorkerSettings", "advice", "warn_on_ready"]

logger = logging.getLogger("celery_scheduler.worker")


@dataclass(frozen=True)
class WorkerSettings:
    """What of a starting worker decides how long a released task may wait in it."""

    transport: str  # kombu's driver type: "amqp" for RabbitMQ, "redis", ...
    pool: str  # the pool's name: "solo", "prefork", "threads", ...
    prefetch_count: int  # the count the worker starts with (0: unlimited)
    release_eta: bool = False  # the app's scheduler_release_eta
    eta_task_limit: int | None = None  # Celery's worker_eta_task_limit (None: no limit)

    @classmethod
    def of(cls, consumer: Any) -> WorkerSettings:
        """Read them from the ``sender`` of Celery's ``worker_ready`` signal (a Consumer)."""
        connection = consumer.connection or consumer.app.connection_for_read()
        pool = type(consumer.pool).__module__.rsplit(".", 1)[-1] if consumer.pool is not None else ""
        limit = consumer.app.conf.get("worker_eta_task_limit")
        return cls(transport=str(getattr(connection.transport, "driver_type", "")),
                   pool=pool,
                   prefetch_count=int(consumer.initial_prefetch_count or 0),
                   release_eta=get_settings(consumer.app).release_eta,
                   eta_task_limit=None if limit is None else int(limit))


def advice(settings: WorkerSettings) -> list[str]:
    """The warnings for a worker started with *settings*; empty when none applies."""
    found = []
    if settings.pool == "solo" and settings.prefetch_count != 1:
        held = "no limit" if settings.prefetch_count == 0 else str(settings.prefetch_count)
        found.append(
            f"this solo worker prefetches {held} messages but runs one task at a time: a "
            f"released task can wait behind a long one while another worker is free. Start it "
            f"with --concurrency=1 (solo takes its prefetch count from --concurrency, which "
            f"defaults to the number of CPUs) and worker_prefetch_multiplier = 1.")
    if settings.transport == "amqp" and settings.pool == "solo":
        found.append(
            "the solo pool on RabbitMQ stops taking messages for tens of seconds after the broker "
            "restarts, and released tasks wait beyond their leases. Use the prefork pool "
            "(Celery's default) or --pool=threads.")
    if settings.release_eta and settings.eta_task_limit is None:
        found.append(
            "scheduler_release_eta is on and worker_eta_task_limit is not set: released tasks "
            "arrive ahead of their due time as eta messages, which do not count against the "
            "prefetch count, so this worker takes all that come its way even while its pool is "
            "busy, and a free worker could have run them. Set worker_eta_task_limit (for example "
            "to the prefetch count).")
    return found


def warn_on_ready(sender: Any = None, **_: Any) -> None:
    """``worker_ready`` handler: log each warning of :func:`advice` for this worker."""
    if sender is None:
        return
    try:
        settings = WorkerSettings.of(sender)
    except Exception:  # advice only: a worker we cannot read starts as it would have
        logger.debug("could not read the worker's settings", exc_info=True)
        return
    for text in advice(settings):
        logger.warning("celery_scheduler: %s", text)
