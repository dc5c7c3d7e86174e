"""The ``celery scheduler`` sub-command, registered through the ``celery.commands`` entry point.

::

    celery -A proj scheduler init                  # create the Kafka topic and Cassandra schema
    celery -A proj scheduler dispatch              # run a dispatcher (run several for more)
    celery -A proj scheduler dispatch --check      # exit 0 if a dispatcher could run here
    celery -A proj scheduler status                # partitions: owner, lease, backlog, lag
    celery -A proj scheduler status ORDERING_ID AT UNIQUENESS_KEY
    celery -A proj scheduler inspect ORDERING_ID AT UNIQUENESS_KEY
    celery -A proj scheduler cancel ORDERING_ID AT UNIQUENESS_KEY
    celery -A proj scheduler retry ORDERING_ID AT UNIQUENESS_KEY   # a failed or blocked key
    celery -A proj scheduler reschedule ORDERING_ID AT UNIQUENESS_KEY --to TIME | --in SECONDS
    celery -A proj scheduler cancel-many [--ordering-id ID] [--task NAME] [--from T] [--before T] [--dry-run]
    celery -A proj scheduler pause|resume --task NAME | --ordering-id ID | --all
    celery -A proj scheduler pauses                # the pauses in force
    celery -A proj scheduler rate-limit --task NAME | --ordering-id ID --per-second N | --lift
    celery -A proj scheduler rate-limits           # the rate limits in force
    celery -A proj scheduler audit                 # the operators' log: who did what, when
    celery -A proj scheduler dead-letters list [--reason TEXT]
    celery -A proj scheduler dead-letters replay [--reason TEXT]
    celery -A proj scheduler periodic list|trigger|backfill   # beat_schedule's entries
    celery -A proj scheduler serve                 # the web console and HTTP API
    celery -A proj scheduler spark schedule PATH --task NAME --at COLUMN ...
"""

from __future__ import annotations

from celery_scheduler.cli import (  # noqa: F401  (their commands join the group)
    audit,
    bulk,
    jobs,
    limiting,
    moving,
    operate,
    pausing,
    periodic,
)
from celery_scheduler.cli.group import scheduler

__all__ = ["scheduler"]
