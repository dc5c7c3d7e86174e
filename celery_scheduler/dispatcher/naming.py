"""A task scheduled with a Celery task id of its own names one task.

A schedule record whose options carry ``task_id`` (every call of the drop-in eta mode, a
call given ``task_id=``, a rescheduled task) names its task by its ordering id and
uniqueness key, and the store keeps the key it was last scheduled under
(``TaskWriter.named_keys``). A later record of the same name at another time (the same
``apply_async`` made again, whose countdown gives an eta a few milliseconds later) moves
that task there, as a reschedule does, while it is pending and was never released; once it
was released, ran or was cancelled, the later record is dropped: a task id runs once.

:func:`resolve` decides it for the ingest loop, before the keys of a round are claimed, so
that the key moved is held from the engine as a cancelled one is (see claims.py).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from celery_scheduler.keys import TaskKey
from celery_scheduler.store.base import Operation, Put, Reschedule, State, TaskWriter
from celery_scheduler.store.lifecycle import reschedule_problem

__all__ = ["named", "resolve"]

logger = logging.getLogger("celery_scheduler.dispatcher.ingest")  # its lines are the ingest's


def named(operation: Operation) -> TaskKey | None:
    """The key *operation* schedules under a name of its own (a put or a move of a task
    that carries its task id); None if it names none."""
    if isinstance(operation, (Put, Reschedule)) and "task_id" in operation.envelope.options:
        return operation.envelope.key
    return None


def resolve(store: TaskWriter, operations: Sequence[Operation]) -> list[Operation | None]:
    """*operations*, each put of a named task whose name the store keeps under another key
    made a move of that key, or None (dropped) if that key may not move."""
    earlier: dict[TaskKey, TaskKey] = {}
    puts = [op for op in operations if isinstance(op, Put) and named(op) is not None]
    if puts:
        names = store.named_keys([(op.key.ordering_id, op.key.uniqueness_key) for op in puts])
        for put in puts:
            found = names.get((put.key.ordering_id, put.key.uniqueness_key))
            if found is not None and found != put.key:
                earlier[put.key] = found
    if not earlier:
        return list(operations)
    statuses = dict(zip(earlier.values(), store.statuses(list(earlier.values())), strict=True))
    resolved: list[Operation | None] = []
    for op in operations:
        old = earlier.get(op.key) if isinstance(op, Put) else None
        if old is None or statuses[old] is None:  # none, or its status expired: a new task
            resolved.append(op)
            continue
        assert isinstance(op, Put)
        status = statuses[old]
        moved = (store.kept_envelope(old)
                 if status is not None and status.state is State.RESCHEDULED else None)
        problem = reschedule_problem(status, moved.key if moved else None, op.key)
        if problem is None:
            resolved.append(Reschedule(op.partition, old, op.envelope, op.data))
        else:
            logger.info("not scheduling %s: its task id %s was scheduled as %s, and %s; a task id "
                        "runs once", op.key, op.envelope.task_id, old, problem)
            resolved.append(None)
    return resolved
