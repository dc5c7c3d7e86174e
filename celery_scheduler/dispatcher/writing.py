"""The write path of every record read, and of periodic occurrences (``firer.py``): the
store applies the operations, then the engine hears what they stored.

A put of a task scheduled under its own task id may move the key its name was scheduled
under, or be dropped (:mod:`~celery_scheduler.dispatcher.naming`): decided before the keys
are claimed. Each key's status is read, then written from what was read; the engine marks
none of them released in between (:mod:`~celery_scheduler.dispatcher.claims`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from celery_scheduler.clock import Clock
from celery_scheduler.dispatcher import naming
from celery_scheduler.dispatcher.engine import Engine
from celery_scheduler.errors import SchedulerError
from celery_scheduler.keys import TaskKey
from celery_scheduler.store.base import Cancel, Operation, Reschedule, Retry, StoredTask, TaskWriter
from celery_scheduler.store.lifecycle import reschedule_problem
from celery_scheduler.store.records import State
from celery_scheduler.tracing import DispatcherSpans

__all__ = ["Writer"]

# its lines are the ingest loop's, as they were before this module was split from it
logger = logging.getLogger("celery_scheduler.dispatcher.ingest")


class Writer:
    """Writes operations to *store* and tells *engine* what they stored."""

    def __init__(self, store: TaskWriter, engine: Engine, clock: Clock,
                 spans: DispatcherSpans | None = None) -> None:
        self.store = store
        self.engine = engine
        self.clock = clock
        self.spans = spans  # traced tasks' persist spans (tracing.py)
        self.persisted_count = 0

    def apply(self, operations: Sequence[Operation]) -> None:
        """Write *operations* (of distinct keys) and tell the engine what they stored: the
        write path of every record read, and of periodic occurrences (firer.py)."""
        # A put of a task scheduled under its own task id may move the key its name was
        # scheduled under, or be dropped (naming.py): decided before the keys are claimed.
        resolved = naming.resolve(self.store, operations)
        operations = [op for op in resolved if op is not None]
        # Each key's status is read, then written from what was read: the engine must not
        # mark any of them released in between (see claims.py).
        started = self.clock()
        with self.engine.claims.ingesting(operations):
            results = self.store.apply(operations, started)
        named = [(op.partition, key) for op, result in zip(operations, results, strict=True)
                 if isinstance(result, StoredTask) and (key := naming.named(op)) is not None]
        if named:  # before the next round's records of these ordering ids are resolved
            self.store.name_keys(named, started)
        if self.spans is not None and self.spans.enabled:
            self.spans.persisted([(r.envelope, r.partition) for r in results if isinstance(r, StoredTask)],
                                 started, self.clock())
        cancelled: list[TaskKey] = []  # told to the engine in one event
        for operation, result in zip(operations, results, strict=True):
            if isinstance(operation, Cancel):
                if result:
                    logger.info("cancelled %s", operation.key)
                    self.engine.metrics.cancelled()
                cancelled.append(operation.key)
            elif isinstance(operation, Retry) and result is None:
                logger.warning("not retrying %s: it is not failed, or failed before its task "
                               "was kept for a retry", operation.key)
            elif isinstance(operation, Reschedule):
                cancelled.append(operation.key)  # the old key goes like a cancelled one
                self._rescheduled(operation, result)
            elif isinstance(result, StoredTask):
                if isinstance(operation, Retry):
                    logger.info("retrying %s after attempt %d", operation.key, result.attempts)
                self.persisted_count += 1
                self.engine.metrics.persisted()
                self.engine.persisted(result)
        self.engine.cancelled_many(cancelled)

    def _rescheduled(self, operation: Reschedule, result: StoredTask | bool | None) -> None:
        if isinstance(result, StoredTask):
            logger.info("rescheduled %s to %s", operation.key, result.key)
            self.persisted_count += 1
            self.engine.metrics.rescheduled()
            self.engine.persisted(result)
        else:
            logger.warning("not rescheduling %s to %s: %s", operation.key, operation.envelope.key,
                           self._why_not_moved(operation))

    def _why_not_moved(self, operation: Reschedule) -> str:
        try:
            current = self.store.status(operation.key)
            moved = (self.store.kept_envelope(operation.key)
                     if current is not None and current.state is State.RESCHEDULED else None)
        except SchedulerError as exc:
            return f"its status could not be read ({exc})"
        problem = reschedule_problem(current, moved.key if moved else None, operation.envelope.key)
        return problem or f"{operation.envelope.key} ran or was cancelled already"
