"""Partition leases (fencing): taken for every assigned partition, renewed all together (one
lightweight transaction on Cassandra) every third of their length, and let go when another
owner has them or this process's ingest loop hangs. A partition is released from only while
its lease is certainly valid by this process's own monotonic clock, and its writes are
stamped no later than the lease's end (see ``write_fence``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

from celery_scheduler.dispatcher.state import EngineSettings, Partition
from celery_scheduler.dispatcher.timetable import Timetable
from celery_scheduler.errors import SchedulerError, StoreUnavailableError
from celery_scheduler.store.base import Lease, LeaseTable

__all__ = ["Leases"]

logger = logging.getLogger("celery_scheduler.dispatcher.engine")  # its lines are the engine's


class Leases:
    """The leases of the partitions an engine was assigned: its own state, the engine's
    partitions (shared, the engine adds and removes them) and what it asks the store.

    Its thread is the engine's, but for :meth:`write_fence`, :meth:`certain`,
    :meth:`may_persist` and :meth:`leased`, called from other threads (the store's, the
    on-time sender's, the ingest loop's): only the engine's thread changes what they read.
    """

    def __init__(self, store: LeaseTable, settings: EngineSettings, owner: str,
                 clock: Callable[[], int], monotonic: Callable[[], float],
                 partitions: dict[int, Partition], timetable: Timetable) -> None:
        self.store = store
        self.settings = settings
        self.owner = owner
        self.clock = clock
        self._monotonic = monotonic
        self.partitions = partitions
        self.timetable = timetable
        # Read by the ingest thread: the partitions whose lease this engine holds (or held
        # last, while the store could not be asked). Only the engine thread changes it.
        self._writable: set[int] = set()
        # Per partition ever leased: the time its writes are fenced at (monotonic): its
        # lease's end while held, the moment it was given up after; read by the store's
        # threads (see write_fence), replaced whole.
        self._fences: dict[int, float] = {}
        self._renewals_failing = False  # the last renewal failed: said once, until one succeeds
        self._takes_failing: float | None = None  # since when taking leases fails: said once
        self.ingest_mono: float | None = None  # the ingest loop's last report, once it runs
        self._ingest_stalled = False

    def may_persist(self, partition: int) -> bool:
        """Whether this process may write *partition*'s new tasks: it holds the lease.

        A dispatcher that reads a partition from Kafka while another holds its lease (Kafka
        gave it the partition, but the holder has not let go) must not write: the holder's
        engine, whose schedule is loaded past where those tasks fall, would never see them,
        and could release a later task of their ordering id first. A partition stays
        writable while its renewal merely fails (the store is down: writes fail too) or is
        late; it stops being writable when the lease is found in other hands, and becomes
        writable only once the lease is taken.
        """
        return partition in self._writable

    def leased(self) -> frozenset[int]:
        """The partitions this process holds the lease of (any thread)."""
        return frozenset(self._writable)

    def ingest_alive(self) -> None:
        """Called by the ingest loop on every pass (see ``ingest_stall_seconds``)."""
        self.ingest_mono = self._monotonic()

    def certain(self, number: int) -> bool:
        """Whether this process's lease of partition *number* is certainly valid (any thread)."""
        return self._monotonic() < self._fences.get(number, 0.0)

    def give_up(self, numbers: list[int]) -> None:
        """Partitions *numbers* are revoked: not written, their writes fenced from now, their
        state dropped and their leases given back (one that cannot be ends on its own)."""
        for number in numbers:
            self._writable.discard(number)
            self.forget_fence(number)
            partition = self.partitions.pop(number, None)
            if partition is not None and partition.lease is not None:
                try:
                    self.store.release_lease(partition.lease)
                except Exception as exc:  # it ends on its own; the others are given up still
                    logger.warning("could not give up the lease of partition %d: %s", number, exc,
                                   exc_info=not isinstance(exc, SchedulerError))

    def _lease_end(self, lease_mono: float) -> float:
        """When a lease requested at *lease_mono* ends by our own clock, with a margin."""
        margin = min(2.0, self.settings.partition_lease_seconds / 4)
        return lease_mono + self.settings.partition_lease_seconds - margin

    def may_release(self, partition: Partition) -> bool:
        """Whether the engine may release from *partition*: its lease is certainly ours."""
        if partition.lease is None:
            return False
        # Valid by our own clock, counted from when the request was sent.
        return self._monotonic() < self._lease_end(partition.lease_mono)

    def write_fence(self, partition: int) -> float | None:
        """The wall-clock time this process's writes of *partition* must not be stamped after.

        The end of its lease while held; once given up, the moment it was given up (or its
        end, if that came first), for good: no write of a partition this process no longer
        holds is legitimate, and one decided before may still be on its way, however long
        the process was paused. None for a partition never held. See
        :mod:`celery_scheduler.store.fencing`. Called from the store's threads.
        """
        fence = self._fences.get(partition)
        if fence is None:
            return None
        return self.clock() / 1000 + fence - self._monotonic()

    def _hold(self, number: int, partition: Partition, lease: Lease, mono: float) -> None:
        partition.lease, partition.lease_mono = lease, mono
        self._writable.add(number)
        self._fences = {**self._fences, number: self._lease_end(mono)}

    def forget_fence(self, number: int) -> None:
        """*number*'s lease is given up: writes decided before meet its fence from now on."""
        if number in self._fences:
            self._fences = {**self._fences, number: min(self._fences[number], self._monotonic())}

    def _drop_lease(self, number: int, partition: Partition) -> None:
        self.forget_fence(number)
        self._writable.discard(number)
        self.timetable.drop_partitions([number])
        partition.lease, partition.loader.cursor = None, None

    def _ingest_hangs(self) -> bool:
        """Whether the ingest loop has not come back for too long; if so, let go of every lease."""
        if self.ingest_mono is None:
            return False
        stalled = self._monotonic() - self.ingest_mono > self.settings.ingest_stall_seconds
        if stalled and not self._ingest_stalled:
            logger.error("the Kafka consumer loop has not come back for %.0fs: giving up the leases "
                         "of partitions %s so that their readers can write and release them",
                         self.settings.ingest_stall_seconds, sorted(self.partitions))
            for number, partition in self.partitions.items():
                if partition.lease is not None:
                    with contextlib.suppress(SchedulerError):
                        self.store.release_lease(partition.lease)
                    self._drop_lease(number, partition)
        elif self._ingest_stalled and not stalled:
            logger.info("the Kafka consumer loop is back; taking leases again")
        self._ingest_stalled = stalled
        return stalled

    def maintain(self) -> None:
        """Take the leases of partitions not held, and renew all of them once one is due."""
        if self._ingest_hangs():
            return
        ttl_ms = int(self.settings.partition_lease_seconds * 1000)
        mono = self._monotonic()
        wanted = [number for number, partition in self.partitions.items()
                  if partition.lease is None and mono >= partition.next_attempt_mono]
        if wanted:
            self._take_leases(wanted, ttl_ms)
        # A renewal is a lightweight transaction (several round trips) on the thread that
        # releases, and the store renews any number of leases with one: when one is due,
        # every lease held goes with it, so that they stay due together.
        held = [(number, partition) for number, partition in self.partitions.items()
                if partition.lease is not None]
        if any(mono - partition.lease_mono >= self.settings.partition_lease_seconds / 3
               for _, partition in held):
            self._renew_leases(held, ttl_ms)

    def _take_leases(self, wanted: list[int], ttl_ms: int) -> None:
        mono = self._monotonic()
        for number in wanted:
            self.partitions[number].next_attempt_mono = mono + 0.5
        try:
            taken = self.store.acquire_leases(wanted, self.owner, ttl_ms, self.clock())
        except SchedulerError as exc:
            # tried again every 0.5 s while it lasts: said once (it was said every time, two
            # lines a second through a Cassandra restart). An outage says all in its message;
            # anything else gets its traceback.
            logger.log(logging.DEBUG if self._takes_failing is not None else logging.WARNING,
                       "could not take the leases of partitions %s (%s); trying again every "
                       "0.5s", wanted, exc, exc_info=not isinstance(exc, StoreUnavailableError))
            if self._takes_failing is None:
                self._takes_failing = mono
            return
        if self._takes_failing is not None:
            logger.info("could take leases again, after %.1fs of failures",
                        mono - self._takes_failing)
            self._takes_failing = None
        for number in wanted:
            lease = taken.get(number)
            if lease is None:
                self._writable.discard(number)  # another dispatcher holds it
            else:
                self._hold(number, self.partitions[number], lease, mono)
                logger.info("leased partition %d (epoch %d)", number, lease.epoch)

    def _renew_leases(self, held: list[tuple[int, Partition]], ttl_ms: int) -> None:
        mono = self._monotonic()
        try:
            renewed = self.store.renew_leases([partition.lease for _, partition in held
                                               if partition.lease is not None],
                                              ttl_ms, self.clock())
        except SchedulerError as exc:
            # tried again at every step while they last: said once (it was said at every
            # step, with a traceback, through a Cassandra restart)
            logger.log(logging.DEBUG if self._renewals_failing else logging.WARNING,
                       "could not renew the leases of partitions %s (%s); trying again at "
                       "every step", [number for number, _ in held], exc,
                       exc_info=not isinstance(exc, StoreUnavailableError))
            self._renewals_failing = True
            return
        if self._renewals_failing:
            logger.info("renewed the leases of partitions %s again", [number for number, _ in held])
            self._renewals_failing = False
        for (number, partition), lease in zip(held, renewed, strict=True):
            if lease is None:
                logger.warning("lost the lease of partition %d to another dispatcher", number)
                self._drop_lease(number, partition)
            else:
                self._hold(number, partition, lease, mono)
