"""Which task keys the ingest loop and the engine are deciding right now, so they never
decide the same key at once.

The ingest loop reads a task's status and writes a put or a cancel based on what it read;
the engine marks due tasks released. Both run in one process, on their own threads, against
the same rows. Without this, a release marked between a cancel's read and its write was
overwritten by the cancel: the task ran while its status said it never would. So:

* the ingest loop holds the keys of a round from its read to the end of its write, and waits
  while the engine is marking any of them released;
* the engine marks only keys the ingest loop does not hold, and none whose cancel the engine
  has not yet taken note of (its cancelled event is still queued, or the write failed and
  the batch will be applied again).

A cancel that comes after the marking then reads "released" and leaves it alone: the task
runs, as a cancel that comes too late always did. Only the engine releases, so only its
markings need guarding.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

from celery_scheduler.errors import StoreUnavailableError
from celery_scheduler.keys import TaskKey
from celery_scheduler.store.base import Cancel, Operation, Reschedule

__all__ = ["Claims"]


class Claims:
    """Keys held by the ingest loop, keys being marked released, and unsettled cancels."""

    def __init__(self, wait_seconds: float = 30.0) -> None:
        self.wait_seconds = wait_seconds
        self._changed = threading.Condition()
        self._ingesting: set[TaskKey] = set()
        self._releasing: set[TaskKey] = set()
        self._cancels: dict[TaskKey, int] = {}  # key -> partition, until the engine notes it

    @contextmanager
    def ingesting(self, operations: Sequence[Operation]) -> Iterator[None]:
        """Hold the keys of *operations* while the ingest loop reads and writes them.

        Waits while the engine marks any of them released; a marking that takes longer than
        ``wait_seconds`` means the store is not answering, and the round is given up.
        """
        keys = {op.key for op in operations}
        keys.update(op.envelope.key for op in operations if isinstance(op, Reschedule))
        with self._changed:
            if not self._changed.wait_for(lambda: self._releasing.isdisjoint(keys), self.wait_seconds):
                raise StoreUnavailableError(
                    f"tasks were being marked released for over {self.wait_seconds:g}s; "
                    "the batch will be applied again")
            self._ingesting |= keys
            # From here until the engine takes note, none of these cancels' tasks is released:
            # the write may land even if it fails here, and the batch is applied again.
            # (a reschedule's old key is held as a cancelled one is)
            self._cancels.update((op.key, op.partition) for op in operations
                                 if isinstance(op, (Cancel, Reschedule)))
        try:
            yield
        finally:
            with self._changed:
                self._ingesting -= keys

    def take_for_release(self, keys: Iterable[TaskKey]) -> set[TaskKey]:
        """Those of *keys* the engine may mark released now; it must call :meth:`marked`."""
        with self._changed:
            free = {key for key in keys if key not in self._ingesting and key not in self._cancels}
            self._releasing |= free
            return free

    def marked(self, keys: Iterable[TaskKey]) -> None:
        """The engine is done marking *keys* released (or gave up): ingest may read them."""
        with self._changed:
            self._releasing.difference_update(keys)
            self._changed.notify_all()

    def cancel_noted(self, key: TaskKey) -> None:
        """The engine has handled the cancel of *key*: its task is no longer held back."""
        with self._changed:
            self._cancels.pop(key, None)

    def forget_partitions(self, partitions: Iterable[int]) -> None:
        """Drop unsettled cancels of partitions given up: their next owner reads the store."""
        gone = set(partitions)
        with self._changed:
            self._cancels = {k: p for k, p in self._cancels.items() if p not in gone}

    def unsettled_cancels(self) -> int:
        return len(self._cancels)
