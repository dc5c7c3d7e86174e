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

from collections.abc import Callable, Sequence

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
        self.cancelled_many((key,))

    def cancelled_many(self, keys: Sequence[TaskKey]) -> None:
        """The ingest loop applied cancels of *keys*: drop each task whose status says so
        (the statuses of those loaded read in one request a slot, as a bulk cancel needs)."""
        loaded: list[tuple[TaskKey, int]] = []
        for key in keys:
            self.unconfirmed.pop(key, None)
            task = self.timetable.get(key)
            if task is None or self.timetable.is_in_flight(key):
                self.claims.cancel_noted(key)
            else:
                loaded.append((key, task.partition))
        if not loaded:
            return
        try:
            statuses = self.store.statuses([key for key, _ in loaded])
        except SchedulerError:
            self.unconfirmed.update(loaded)
            return
        for (key, _), status in zip(loaded, statuses, strict=True):
            self.claims.cancel_noted(key)
            if status is None or status.state in (State.CANCELLED, State.RESCHEDULED):
                self.drop(key)

    def confirm(self) -> None:
        """Read again, each second, the status behind cancels the store could not confirm."""
        now = self.clock()
        if not self.unconfirmed or now < self._confirm_ms:
            return
        self._confirm_ms = now + CONFIRM_CANCEL_EVERY_MS
        self.cancelled_many(list(self.unconfirmed))

    def forget_partitions(self, gone: set[int]) -> None:
        """*gone* are given up: their next owner reads the store."""
        self.unconfirmed = {k: p for k, p in self.unconfirmed.items() if p not in gone}
