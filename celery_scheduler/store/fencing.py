"""Write timestamps that fence a paused dispatcher's late writes out.

Cassandra keeps, for every cell, the write with the highest timestamp, whatever order the
writes arrive in. A dispatcher paused between deciding a write and sending it (SIGSTOP, a
long garbage collection, a frozen VM) may send it after another dispatcher took its
partitions over and wrote since: a put that brings back a task the new owner cancelled or
finished, to run once more after later tasks of its ordering id.

The lease protocol already says when a dispatcher stops owning a partition: at the end of
its lease by its own clock, which the next owner waits out, or when it gives the lease up.
So a dispatcher stamps each write no later than that moment for the partition the write
belongs to, and every write of that partition's next owner, made after it, carries a
higher timestamp and wins.

The fence is per partition. Held at the earliest end over all of a process's leases, a
dispatcher that lost a partition and took it back later would stamp its writes earlier
than the owner in between, and its completions would lose to that owner's older puts.

A request may still carry the writes of several partitions (:meth:`FencedTimestamps.shared`):
one timestamp serves them all when it is within every one's fence, which is the case
whenever the process holds their leases; otherwise each partition's writes go on their own.

Held at the fence, a late write still lands if nothing of the next owner's writes the same
cells: a decision made from reads (a periodic occurrence fired because the run before had
started) then stays, though the next owner decided otherwise and wrote nothing. Within
:meth:`FencedTimestamps.refusing_late`, such a write is not sent: it raises
:class:`~celery_scheduler.errors.LeaseEndedError` instead.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager

from celery_scheduler.errors import LeaseEndedError

__all__ = ["FencedTimestamps"]


class FencedTimestamps:
    """A Cassandra driver ``timestamp_generator``: now, but never past the partition's fence.

    The driver calls it, without arguments, on the thread that sends a request; the store
    names the partition a request writes with :meth:`writing` around sending it.
    ``fence(partition)`` returns the wall-clock time (seconds) that the partition's writes
    must not be stamped after, or None for no limit. Each partition's timestamps also rise
    by at least a microsecond per write, so one process's writes keep their order even once
    they are held at the fence.
    """

    def __init__(self) -> None:
        self.fence: Callable[[int], float | None] = lambda partition: None
        self.wall: Callable[[], float] = time.time  # seconds since the epoch
        self._lock = threading.Lock()
        self._last: dict[int | None, int] = {}
        self._local = threading.local()

    @contextmanager
    def writing(self, partition: int | None, stamp: int | None = None) -> Iterator[None]:
        """Stamp the requests this thread sends within the block as *partition*'s writes, or
        with *stamp*, one that :meth:`shared` gave."""
        self._local.partition, self._local.stamp = partition, stamp
        try:
            yield
        finally:
            self._local.partition = self._local.stamp = None

    @contextmanager
    def refusing_late(self) -> Iterator[None]:
        """Within the block, a write this thread sends past its partition's fence raises
        :class:`LeaseEndedError` instead of being stamped at the fence: for writes decided
        from what was read, which are only right while the lease holds."""
        before = getattr(self._local, "refusing", False)
        self._local.refusing = True
        try:
            yield
        finally:
            self._local.refusing = before

    def shared(self, partitions: Collection[int]) -> int | None:
        """One timestamp for a request writing all of *partitions*: now, above each one's last
        write; None if it would pass any partition's fence (send each partition's on its own,
        where :meth:`__call__` holds it at its fence)."""
        now = int(self.wall() * 1_000_000)
        limits = [self.fence(partition) for partition in partitions]
        with self._lock:
            stamp = max([now, *(self._last.get(partition, 0) + 1 for partition in partitions)])
            if any(limit is not None and stamp > int(limit * 1_000_000) for limit in limits):
                return None
            for partition in partitions:
                self._last[partition] = stamp
        return stamp

    def __call__(self) -> int:
        preset: int | None = getattr(self._local, "stamp", None)
        if preset is not None:
            return preset
        partition: int | None = getattr(self._local, "partition", None)
        stamp = int(self.wall() * 1_000_000)
        limit = None if partition is None else self.fence(partition)
        if partition is not None and limit is not None and stamp > int(limit * 1_000_000):
            if getattr(self._local, "refusing", False):
                raise LeaseEndedError(partition, limit, stamp / 1_000_000)
            stamp = int(limit * 1_000_000)
        with self._lock:
            stamp = self._last[partition] = max(stamp, self._last.get(partition, 0) + 1)
        return stamp
