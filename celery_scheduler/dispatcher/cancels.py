"""Cancels as the engine applies them: a task the ingest loop cancelled (or moved to another
time) leaves memory once the store confirms its status is still cancelled (or rescheduled).

The engine does not mark a task released while its cancel is read and written, nor until
the cancel reaches it (see :mod:`celery_scheduler.dispatcher.claims`); but a marking by the
partition's previous owner may have overwritten the cancel, and then the task must still
run. Only a status that is still cancelled drops it. If the store cannot say, the task
stays held and its status is read again each second: released meanwhile, it could run
though its cancel was written.
"""

from __future__ import annotations

from collections.abc import Callable

from celery_scheduler.dispatcher.claims import Claims
from celery_scheduler.dispatcher.timetable import Timetable
from celery_scheduler.errors import SchedulerError
from celery_scheduler.keys import TaskKey
from celery_scheduler.store.base import State, StatusReads

__all__ = ["CONFIRM_CANCEL_EVERY_MS", "Cancels"]

# A cancel whose task's status could not be read is read again this often (ms).
CONFIRM_CANCEL_EVERY_MS = 1000


class Cancels:
    """The cancels an engine has heard of; called from the engine's thread only."""

    def __init__(self, store: StatusReads, claims: Claims, timetable: Timetable,
                 drop: Callable[[TaskKey], None], clock: Callable[[], int]) -> None:
        self.store = store
        self.claims = claims
        self.timetable = timetable
        self.drop = drop
        self.clock = clock
        # cancels whose task's status the store could not read, by key: held until it answers
        self.unconfirmed: dict[TaskKey, int] = {}  # key -> its partition
        self._confirm_ms = 0

    def cancelled(self, key: TaskKey) -> None:
        """The ingest loop applied a cancel of *key*: drop the task if its status says so."""
        self.unconfirmed.pop(key, None)
        task = self.timetable.get(key)
        if task is None or self.timetable.is_in_flight(key):
            self.claims.cancel_noted(key)
            return
        try:
            status = self.store.status(key)
        except SchedulerError:
            self.unconfirmed[key] = task.partition
            return
        self.claims.cancel_noted(key)
        if status is None or status.state in (State.CANCELLED, State.RESCHEDULED):
            self.drop(key)

    def confirm(self) -> None:
        """Read again, each second, the status behind cancels the store could not confirm."""
        now = self.clock()
        if not self.unconfirmed or now < self._confirm_ms:
            return
        self._confirm_ms = now + CONFIRM_CANCEL_EVERY_MS
        for key in list(self.unconfirmed):
            self.cancelled(key)

    def forget_partitions(self, gone: set[int]) -> None:
        """*gone* are given up: their next owner reads the store."""
        self.unconfirmed = {k: p for k, p in self.unconfirmed.items() if p not in gone}
