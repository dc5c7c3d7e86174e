"""What a schedule record, a cancel and a retry may do to a task key, decided from its status.

Pure functions, used by both stores (Cassandra and memory), so the rules are written once;
the stores turn a decision into writes. A key's life::

    pending ──release──> released ──success──> succeeded           (final)
       │  ^                 │ └──failure──> pending (a retry after its backoff)
       │  └──retry (operator)── failed <──last failure (or blocked: row kept)
       └──cancel──> cancelled                                        (final)

A schedule record read again (after a failed batch or a rebalance) or sent again never
undoes a later step: it rewrites a key only while it is pending and never released.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from celery_scheduler.keys import TaskKey
from celery_scheduler.store.base import State, TaskStatus, write_bucket

__all__ = ["PutPlan", "may_cancel", "may_retry", "plan_put"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PutPlan:
    """Where a put writes its row, and the row of the key it replaces elsewhere, if any."""

    bucket: int
    moved_from: tuple[int, int] | None = None  # (partition, bucket) to delete


def _kept(key: TaskKey, current: TaskStatus) -> bool:
    """Whether *current* says *key* must not be written again (and log why)."""
    if current.state.finished:
        logger.info("not scheduling %s again: it already %s", key, current.state.value)
    elif current.state is State.RELEASED:
        logger.info("not rescheduling %s: it is running", key)
    elif current.state is State.CANCELLED:
        # A schedule record read again after its cancel must not bring the task back.
        logger.info("not scheduling %s again: it was cancelled", key)
    elif current.attempts > 0:
        logger.info("not rescheduling %s: it waits for attempt %d", key, current.attempts + 1)
    else:
        return False
    return True


def plan_put(partition: int, key: TaskKey, current: TaskStatus | None, now_ms: int,
             bucket_seconds: int) -> PutPlan | None:
    """Where a put of *key* into *partition* writes, or None if it must not (see ``put``).

    A pending key is rewritten in place, in the bucket it was first written to: the rows of
    an ordering id must stay in the order they were written (see ``ScheduleStore.put``). If
    its row is in another partition (the topic was migrated), that row goes.
    """
    if current is not None and _kept(key, current):
        return None
    bucket = write_bucket(key.scheduled_ms, now_ms, bucket_seconds)
    if current is None or current.state is not State.PENDING or current.bucket is None:
        return PutPlan(bucket)
    if current.partition == partition:
        return PutPlan(current.bucket)
    return PutPlan(bucket, (current.partition, current.bucket))


def may_cancel(current: TaskStatus | None) -> bool:
    """Whether a cancel may remove the key: pending, or failed with its row kept (blocked).

    For a failed key the store checks that its row is still there.
    """
    return (current is not None and current.bucket is not None
            and current.state in (State.PENDING, State.FAILED))


def may_retry(current: TaskStatus | None) -> bool:
    """Whether an operator's retry may make the key pending again: only a failed one."""
    return current is not None and current.state is State.FAILED
