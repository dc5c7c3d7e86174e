"""The release engine: one thread that owns everything a dispatcher holds in memory.

It receives events (partitions assigned or revoked, tasks persisted or cancelled by the
ingest loop, outcomes reported by workers) on a queue, and in between:

1. takes and renews the lease of every assigned partition (fencing: it releases from a
   partition only while its lease is certainly valid by its own monotonic clock; and the
   ingest loop of its process does not write a partition's new tasks while another
   dispatcher holds its lease, so the tasks of a partition reach the engine that releases
   from it);
2. loads each leased partition's schedule forward (bounded, see ``loader``);
3. releases due tasks, at most one in flight per ordering id, to Celery;
4. acts on outcomes, read from the outcomes topic: success finishes the key and frees its
   ordering id; failure retries with jittered exponential backoff or, after the last
   attempt, fails (or blocks) it; a task whose outcome does not arrive before its lease
   ends is released again. Once an outcome's effect is stored, its offset may be committed.

Flow control: at most a window of tasks is in flight (released and not finished) at once,
so a backlog waits here, oldest first, rather than in the broker's queue, where a task
could outlive its lease before a worker takes it. The window follows the rate at which
outcomes come back (``max_in_flight`` fixes it instead).

Owning all state in one thread keeps the ordering rules free of locks.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from celery_scheduler.bridge import Release, publish_each
from celery_scheduler.completion import Outcome
from celery_scheduler.dispatcher.claims import Claims
from celery_scheduler.dispatcher.loader import PartitionLoader, loaded_from
from celery_scheduler.dispatcher.outcomes import OutcomeBatch
from celery_scheduler.dispatcher.timetable import Loaded, Timetable
from celery_scheduler.errors import ReleaseNotSentError, SchedulerError
from celery_scheduler.keys import TaskKey
from celery_scheduler.metrics import Metrics
from celery_scheduler.store.base import Lease, RunTimes, ScheduleStore, State, StoredTask, TaskStatus

__all__ = ["Engine", "EngineSettings"]

logger = logging.getLogger(__name__)

Publish = Callable[[Loaded, Release], None]
# Publishes a step's releases in order; for each, None (sent), ReleaseNotSentError (certainly
# not sent: released again soon) or another error (it may have been sent: it stays released).
PublishMany = Callable[[list[tuple[Loaded, Release]]], list[Exception | None]]


@dataclass(frozen=True)
class EngineSettings:
    lease_seconds: float = 300.0  # a released task's lease
    partition_lease_seconds: float = 10.0  # a partition's ownership lease
    max_attempts: int = 5  # default; each envelope carries its own policy
    on_exhausted: str = "skip"
    max_loaded: int = 5000  # per partition
    lookahead_seconds: float = 60.0
    page_size: int = 500
    outcome_poll_seconds: float = 2.0  # how often the store is asked about in-flight tasks
    release_batch: int = 500  # most tasks released per step, so leases are renewed in between
    max_in_flight: int = 0  # tasks released and not finished at once; 0: follow the outcome rate
    tick_seconds: float = 0.05  # longest sleep between checks
    # The ingest loop of this process not back for this long: it hangs (a Kafka client call
    # that never returns), so its partitions' new tasks go unread; give their leases up.
    ingest_stall_seconds: float = 60.0


@dataclass
class _Partition:
    loader: PartitionLoader
    lease: Lease | None = None
    lease_mono: float = 0.0  # monotonic time the lease request was sent
    next_attempt_mono: float = 0.0


class _Watch:
    """Where the engine thread's time goes, logged every ``every`` seconds (INFO).

    A dispatcher that holds leases but releases little shows here which part of its loop
    (waiting for events, store round trips for leases, schedule reads, outcome checks,
    releases, failed steps) took the time.
    """

    def __init__(self, every: float = 30.0) -> None:
        self.every = every
        self.started = self.mark = time.monotonic()
        self.spent: dict[str, float] = {}
        self.steps = self.failed = 0
        self.released = 0

    def lap(self, phase: str) -> None:
        now = time.monotonic()
        self.spent[phase] = self.spent.get(phase, 0.0) + now - self.mark
        self.mark = now

    def step_done(self, engine: Engine) -> None:
        self.steps += 1
        now = time.monotonic()
        if now - self.started < self.every:
            return
        released, self.released = engine.released_count - self.released, engine.released_count
        phases = ", ".join(f"{name} {seconds:.1f}s" for name, seconds in
                           sorted(self.spent.items(), key=lambda item: -item[1]))
        logger.info("last %.0fs: released %d, %d steps (%d failed); time in %s; %d loaded, %d in "
                    "flight, leases %s", now - self.started, released, self.steps, self.failed,
                    phases, len(engine.timetable), engine.timetable.in_flight_count(),
                    sorted(n for n, p in engine.partitions.items() if p.lease is not None))
        self.started, self.spent, self.steps, self.failed = now, {}, 0, 0


class _Window:
    """How many tasks may be in flight at once: two seconds' worth of outcomes.

    At a steady rate that is about two seconds of the workers' work waiting in the broker,
    enough to keep them busy between releases; a backlog beyond it waits in the timetable.
    The rate is measured every quarter second, so a window that holds back fast workers
    opens within one measurement (while it is full, the rate is the window divided by the
    time a task takes to come back).
    """

    FLOOR = 100  # never fewer: a slow start, or a few long tasks, must not starve the rest
    PERIOD = 0.25  # seconds between measurements of the rate

    def __init__(self, fixed: int) -> None:
        self.fixed = fixed
        self.rate = 0.0
        self._count = 0
        self._mark = time.monotonic()

    def finished(self) -> None:
        self._count += 1

    def size(self) -> int:
        if self.fixed > 0:
            return self.fixed
        now = time.monotonic()
        elapsed = now - self._mark
        if elapsed >= self.PERIOD:
            self.rate, self._count, self._mark = self._count / elapsed, 0, now
        return max(self.FLOOR, int(2 * self.rate))


@dataclass
class _Revoke:
    partitions: list[int]
    done: threading.Event = field(default_factory=threading.Event)


class Engine:
    """Loads, releases and completes tasks for the partitions this dispatcher owns."""

    def __init__(self, store: ScheduleStore, publish: Publish, owner: str,
                 settings: EngineSettings | None = None,
                 clock: Callable[[], int] | None = None, metrics: Metrics | None = None,
                 publish_many: PublishMany | None = None) -> None:
        self.store = store
        self.publish = publish
        # the dispatcher sends a step's releases in one round trip where the broker allows
        self.publish_many: PublishMany = publish_many or (lambda items: publish_each(self.publish, items))
        self.owner = owner
        self.settings = settings or EngineSettings()
        self.clock = clock or (lambda: time.time_ns() // 1_000_000)
        self.timetable = Timetable()
        # keys the ingest loop is deciding: not marked released meanwhile (see claims.py)
        self.claims = Claims()
        self.metrics = metrics or Metrics()
        self.partitions: dict[int, _Partition] = {}
        self.events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self.stopped = threading.Event()
        self._last_poll_ms = 0
        self._succeeded: dict[TaskKey, Loaded] = {}  # finished in memory, not yet in the store
        self._thread: threading.Thread | None = None
        self.released_count = 0
        self.completed_count = 0
        self.last_loop_mono = time.monotonic()
        # Read by the ingest thread: the partitions whose lease this engine holds (or held
        # last, while the store could not be asked). Only the engine thread changes it.
        self._writable: set[int] = set()
        # Per partition ever leased: the time its writes are fenced at (monotonic): its
        # lease's end while held, the moment it was given up after; read by the store's
        # threads (see write_fence), replaced whole.
        self._fences: dict[int, float] = {}
        self._ingest_mono: float | None = None  # the ingest loop's last report, once it runs
        self._ingest_stalled = False
        self._watch = _Watch()
        self._window = _Window(self.settings.max_in_flight)
        # Outcomes read from the outcomes topic: the offset read up to, per partition; the
        # outcomes whose effect could not be stored yet; and the offsets whose outcomes'
        # effects are all stored, which the reader may commit (replaced whole, never
        # changed in place: the reader's thread reads it).
        self._outcomes_read: dict[int, int] = {}
        self._outcome_retries: list[Outcome] = []
        self._durable_offsets: dict[int, int] = {}
        # Whether the outcome reader is keeping up; while it is not, a lease that ends is
        # not taken to mean that the task's outcome is lost.
        self.outcomes_current: Callable[[], bool] = lambda: True

    # --- called from other threads -------------------------------------------------------

    def assign(self, partitions: Iterable[int]) -> None:
        self.events.put(("assign", list(partitions)))

    def revoke(self, partitions: Iterable[int], timeout: float = 30.0) -> bool:
        """Stop releasing from *partitions* and give their leases up; wait until done."""
        request = _Revoke(list(partitions))
        if self._thread is None or not self._thread.is_alive():
            self._revoke(request)
            return True
        self.events.put(("revoke", request))
        return request.done.wait(timeout)

    def persisted(self, task: StoredTask) -> None:
        self.events.put(("persisted", task))

    def cancelled(self, key: TaskKey) -> None:
        self.events.put(("cancelled", key))

    def outcome(self, outcome: Outcome) -> None:
        self.outcomes(OutcomeBatch([outcome], {}))

    def outcomes(self, batch: OutcomeBatch) -> None:
        self.events.put(("outcomes", batch))

    def durable_outcome_offsets(self) -> dict[int, int]:
        """Per partition, the outcomes offset up to which every outcome's effect is stored."""
        return self._durable_offsets

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

    def ingest_alive(self) -> None:
        """Called by the ingest loop on every pass (see ``ingest_stall_seconds``)."""
        self._ingest_mono = time.monotonic()

    def start(self) -> threading.Thread:
        self._thread = threading.Thread(target=self.run, name="celery-scheduler-engine", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self, timeout: float = 30.0) -> None:
        self.stopped.set()
        if self._thread is not None:
            self._thread.join(timeout)

    # --- the engine thread ---------------------------------------------------------------

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                self.step()
            except Exception:
                # A store or broker outage (or a bug) must not stop releasing for good: log
                # it, and try again; nothing in memory is lost by a failed step.
                logger.exception("dispatcher step failed; retrying in 1s")
                self._watch.failed += 1
                self.stopped.wait(1.0)
                self._watch.lap("failed")
        self._revoke(_Revoke(list(self.partitions)))

    def step(self) -> None:
        self.last_loop_mono = time.monotonic()
        watch = self._watch
        self._drain_events(self._wait_seconds())
        watch.lap("events")
        # Tasks already loaded and due go first: recording successes, lease upkeep and
        # schedule reads are store round trips that would otherwise stand between a due time
        # and its release. An ordering id whose task succeeded stays blocked until its
        # success is recorded just after, and its next task goes at the end of the step.
        self._release_due()
        self._store_succeeded()
        watch.lap("release")
        now = self.clock()
        self._maintain_leases()
        watch.lap("leases")
        for partition in list(self.partitions.values()):
            if self._may_release(partition) and partition.loader.due_for_fill(now):
                partition.loader.fill(self.timetable, now)
        # A row the fill read may have been written after an earlier task of its ordering id
        # whose place the cursor had passed: that one is known only by its persisted event,
        # already queued (ingest writes an ordering id's tasks in order, each after the
        # events of the one before). Take those events before releasing anything read.
        self._drain_events(0)
        watch.lap("load")
        self._poll_outcomes()
        watch.lap("outcomes")
        self._release_due()
        self._store_succeeded()
        self._outcomes_stored()
        watch.lap("release")
        self.metrics.state(len(self.timetable), self.timetable.in_flight_count(),
                           sum(1 for p in self.partitions.values() if p.lease is not None))
        watch.step_done(self)

    def _wait_seconds(self) -> float:
        next_due = self.timetable.next_due_ms()
        if next_due is None or self.timetable.in_flight_count() >= self._window.size():
            return self.settings.tick_seconds
        return max(0.0, min(self.settings.tick_seconds, (next_due - self.clock()) / 1000))

    def _drain_events(self, wait: float) -> None:
        if self._outcome_retries:  # outcomes whose effect a failed write did not store
            retries, self._outcome_retries = self._outcome_retries, []
            self._on_outcomes(OutcomeBatch(retries, {}))
        try:
            event = self.events.get(timeout=wait) if wait > 0 else self.events.get_nowait()
        except queue.Empty:
            return
        for _ in range(10_000):
            self._handle(*event)
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                return

    def _handle(self, kind: str, payload: Any) -> None:
        if kind == "assign":
            for number in payload:
                if number not in self.partitions:
                    s = self.settings
                    self.partitions[number] = _Partition(PartitionLoader(
                        self.store, number, page_size=s.page_size, max_loaded=s.max_loaded,
                        lookahead_ms=int(s.lookahead_seconds * 1000)))
            # the reader starts again from the committed offset
            self._durable_offsets = {n: o for n, o in self._durable_offsets.items()
                                     if n not in payload}
            logger.info("assigned partitions %s", sorted(payload))
        elif kind == "revoke":
            self._revoke(payload)
        elif kind == "persisted":
            self._on_persisted(payload)
        elif kind == "cancelled":
            self._on_cancelled(payload)
        elif kind == "outcomes":
            self._on_outcomes(payload)

    def _on_outcomes(self, batch: OutcomeBatch) -> None:
        unknown: list[Outcome] = []
        for outcome in batch.outcomes:
            if outcome.partition not in self.partitions:
                continue
            task = self.timetable.get(outcome.key)
            if task is None:
                unknown.append(outcome)  # not loaded (yet): the store keeps it for the loader
            elif task.awaiting_outcome and outcome.attempt == task.attempts:
                # also for a task a previous owner released: its outcome frees the ordering id
                task.started_ms, task.finished_ms = outcome.started_ms, outcome.finished_ms
                try:
                    self._apply_outcome(task, outcome.succeeded, outcome.error)
                except SchedulerError:
                    logger.warning("could not store the outcome of %s; trying again", outcome.key,
                                   exc_info=True)
                    self._outcome_retries.append(outcome)
            # else an older attempt's outcome, or one of a task not released: nothing to do
        if unknown:
            try:
                self.store.record_outcomes([(o.partition, o.key, o.attempt, o.succeeded, o.error)
                                            for o in unknown], self.clock(),
                                           {o.key: RunTimes(0, o.started_ms, o.finished_ms)
                                            for o in unknown})
            except SchedulerError:
                logger.warning("could not store %d outcome(s); trying again", len(unknown),
                               exc_info=True)
                self._outcome_retries += unknown
        for number, offset in batch.offsets.items():
            if number in self.partitions:
                self._outcomes_read[number] = max(offset, self._outcomes_read.get(number, 0))

    def _outcomes_stored(self) -> None:
        """Mark the outcomes read so far durable, where all of a partition's are stored."""
        if not self._outcomes_read:
            return
        held = {o.partition for o in self._outcome_retries}
        held.update(task.partition for task in self._succeeded.values())
        durable = dict(self._durable_offsets)
        for number, offset in self._outcomes_read.items():
            if number not in held:
                durable[number] = offset
        self._durable_offsets = durable

    def _on_persisted(self, row: StoredTask) -> None:
        partition = self.partitions.get(row.partition)
        if partition is None:
            return
        existing = self.timetable.get(row.key)
        if existing is not None:
            self.timetable.add(loaded_from(row))  # a new version of a loaded key
        elif partition.loader.passed(row.position):
            if self.timetable.count(row.partition) < self.settings.max_loaded:
                self.timetable.add(loaded_from(row))
            else:
                # No room: the cursor goes back to read it again. Later tasks of its ordering
                # id already here would be released before it: they leave memory too, to be
                # read again after it.
                task = loaded_from(row)
                later = self.timetable.waiting_after(task)
                for evicted in later:
                    self.timetable.remove(evicted.key)
                for position in [row.position] + [t.stored.position for t in later]:
                    partition.loader.rewind(position)
                partition.loader.dirty = True
        elif partition.loader.written_ahead(
                row, room=self.timetable.count(row.partition) < self.settings.max_loaded):
            self.timetable.add(loaded_from(row))  # within what is loaded: no need to read it

    def _on_cancelled(self, key: TaskKey) -> None:
        self.claims.cancel_noted(key)
        if key not in self.timetable or self.timetable.is_in_flight(key):
            return
        # This engine does not mark a task released while its cancel is read and written,
        # nor until it gets here (see claims.py); but a marking by the partition's previous
        # owner may have overwritten the cancel, and then the task must still run. Only a
        # status that is still cancelled drops it; if the store cannot say, it stays (a late
        # run is allowed, a lost one is not).
        try:
            status = self.store.status(key)
        except SchedulerError:
            return
        if status is None or status.state is State.CANCELLED:
            self._drop(key)

    def _drop(self, key: TaskKey) -> None:
        """Forget *key* (it will not run here), making room for more of its partition."""
        task = self.timetable.remove(key)
        partition = self.partitions.get(task.partition) if task is not None else None
        if partition is not None:
            partition.loader.room_freed()

    def _revoke(self, request: _Revoke) -> None:
        try:
            self._store_succeeded()  # while the leases are still ours
            self._outcomes_stored()  # so the reader commits them before it lets go
        except SchedulerError:
            logger.warning("could not record finished tasks before a revocation", exc_info=True)
        gone = set(request.partitions)
        self._outcome_retries = [o for o in self._outcome_retries if o.partition not in gone]
        for number in request.partitions:
            self._outcomes_read.pop(number, None)
            self._writable.discard(number)
            self._forget_fence(number)
            partition = self.partitions.pop(number, None)
            if partition is not None and partition.lease is not None:
                try:
                    self.store.release_lease(partition.lease)
                except SchedulerError:
                    logger.warning("could not give up the lease of partition %d", number)
        dropped = self.timetable.drop_partitions(request.partitions)
        self.claims.forget_partitions(request.partitions)
        logger.info("revoked partitions %s (%d tasks dropped from memory)",
                    sorted(request.partitions), dropped)
        request.done.set()

    # --- leases (fencing) ------------------------------------------------------------------

    def _lease_end(self, lease_mono: float) -> float:
        """When a lease requested at *lease_mono* ends by our own clock, with a margin."""
        margin = min(2.0, self.settings.partition_lease_seconds / 4)
        return lease_mono + self.settings.partition_lease_seconds - margin

    def _may_release(self, partition: _Partition) -> bool:
        if partition.lease is None:
            return False
        # Valid by our own clock, counted from when the request was sent.
        return time.monotonic() < self._lease_end(partition.lease_mono)

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
        return time.time() + fence - time.monotonic()

    def _hold(self, number: int, partition: _Partition, lease: Lease, mono: float) -> None:
        partition.lease, partition.lease_mono = lease, mono
        self._writable.add(number)
        self._fences = {**self._fences, number: self._lease_end(mono)}

    def _forget_fence(self, number: int) -> None:
        """*number*'s lease is given up: writes decided before meet its fence from now on."""
        if number in self._fences:
            self._fences = {**self._fences, number: min(self._fences[number], time.monotonic())}

    def _drop_lease(self, number: int, partition: _Partition) -> None:
        self._forget_fence(number)
        self._writable.discard(number)
        self.timetable.drop_partitions([number])
        partition.lease, partition.loader.cursor = None, None

    def _ingest_hangs(self) -> bool:
        """Whether the ingest loop has not come back for too long; if so, let go of every lease."""
        if self._ingest_mono is None:
            return False
        stalled = time.monotonic() - self._ingest_mono > self.settings.ingest_stall_seconds
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

    def _maintain_leases(self) -> None:
        if self._ingest_hangs():
            return
        ttl_ms = int(self.settings.partition_lease_seconds * 1000)
        renewed_one = False
        for number, partition in self.partitions.items():
            mono = time.monotonic()
            if partition.lease is None:
                if mono < partition.next_attempt_mono:
                    continue
                partition.next_attempt_mono = mono + 0.5
                try:
                    lease = self.store.acquire_lease(number, self.owner, ttl_ms, self.clock())
                except SchedulerError:
                    logger.warning("could not take the lease of partition %d", number, exc_info=True)
                    continue
                if lease is None:
                    self._writable.discard(number)  # another dispatcher holds it
                else:
                    self._hold(number, partition, lease, mono)
                    logger.info("leased partition %d (epoch %d)", number, lease.epoch)
                continue
            age = mono - partition.lease_mono
            if age < self.settings.partition_lease_seconds / 3:
                continue
            # Each renewal is a lightweight transaction (several round trips) on the thread
            # that releases: spread them over steps, one per step, so no step waits for all
            # of them at once, unless a lease is half gone (a slow step), then renew it now.
            if renewed_one and age < self.settings.partition_lease_seconds / 2:
                continue
            renewed_one = True
            try:
                renewed = self.store.renew_lease(partition.lease, ttl_ms, self.clock())
            except SchedulerError:
                logger.warning("could not renew the lease of partition %d", number, exc_info=True)
                continue
            if renewed is None:
                logger.warning("lost the lease of partition %d to another dispatcher", number)
                self._drop_lease(number, partition)
            else:
                self._hold(number, partition, renewed, mono)

    # --- release and outcomes -----------------------------------------------------------------

    def _release_due(self) -> None:
        now = self.clock()
        room = self._window.size() - self.timetable.in_flight_count()
        if room <= 0:
            return
        taken = self.timetable.take_due(now, min(room, self.settings.release_batch))
        if not taken:
            return
        # Every task taken is now in flight: whatever fails below, the ones not released,
        # put off or settled go back to their ordering id's queue, or it would stay blocked.
        open_ = {task.key: task for task in taken}
        try:
            self._release_taken(open_, now)
        finally:
            for task in open_.values():
                if self.timetable.is_in_flight(task.key):
                    self.timetable.defer(task.key, now + 1000)

    def _release_taken(self, open_: dict[TaskKey, Loaded], now: int) -> None:
        ready: list[Loaded] = []
        for task in list(open_.values()):
            partition = self.partitions.get(task.partition)
            if partition is None or not self._may_release(partition):
                self.timetable.defer(task.key, now + 200)  # lease not (yet) certain
                del open_[task.key]
                continue
            ready.append(task)
        ready = self._unsettled(ready, open_)
        if not ready:
            return
        # Keys the ingest loop is putting or cancelling right now are decided once it is done.
        free = self.claims.take_for_release(task.key for task in ready)
        for task in ready:
            if task.key not in free:
                self.timetable.defer(task.key, now + 200)
                del open_[task.key]
        ready = [task for task in ready if task.key in free]
        lease_until = now + int(self.settings.lease_seconds * 1000)
        try:
            if ready:
                # Mark them all released (one round trip for the lot), and only then publish:
                # a task another dispatcher could see as not released must not be running.
                self.store.mark_released_many([(t.stored, t.attempts + 1, lease_until) for t in ready],
                                              now)
        finally:
            self.claims.marked(free)
        if ready:
            self._send_marked(ready, open_, lease_until, now)

    def _send_marked(self, ready: list[Loaded], open_: dict[TaskKey, Loaded], lease_until: int,
                     now: int) -> None:
        """Publish *ready*, just marked released until *lease_until*."""
        sending: list[tuple[Loaded, Release]] = []
        for task in ready:
            del open_[task.key]
            partition = self.partitions.get(task.partition)
            if partition is None or not self._may_release(partition):  # the marking took long
                self.timetable.defer(task.key, now + 200)
                continue
            assert partition.lease is not None
            attempt = task.attempts + 1
            task.attempts, task.lease_until_ms, task.released_ms = attempt, lease_until, now
            if attempt == 1:
                task.first_released_ms = now
            task.next_poll_ms = 0
            sending.append((task, Release(task.key, task.partition, attempt, partition.lease.epoch,
                                          lease_until)))
        if not sending:
            return
        failed: list[tuple[Loaded, Exception]] = []
        uncertain: list[tuple[Loaded, Exception]] = []
        for (task, release), error in zip(sending, self.publish_many(sending), strict=True):
            if isinstance(error, ReleaseNotSentError):
                failed.append((task, error))
                continue
            if error is not None:
                uncertain.append((task, error))
            self.released_count += 1
            self.metrics.released((now - task.due_ms) / 1000 if release.attempt == 1 else 0.0)
        if uncertain:
            # Sending it again now could make two copies of one release that run at once,
            # or run beside the next task of the ordering id once the first copy reports: it
            # stays released, and its outcome or the end of its lease decides, as for any.
            logger.warning("%d release(s) may have reached the broker, first %s (%s); waiting "
                           "for their outcome or the end of their lease", len(uncertain),
                           uncertain[0][0].key, uncertain[0][1])
        if failed:
            self._unpublished(failed, now)

    def _unpublished(self, failed: list[tuple[Loaded, Exception]], now: int) -> None:
        """The broker certainly did not take *failed*: undo, and try again in a second.

        The attempt is not spent: no message of it exists.
        """
        logger.warning("could not publish %d task(s) to Celery, first %s (%s); retrying in 1s",
                       len(failed), failed[0][0].key, failed[0][1])
        for task, _ in failed:  # memory first: the store may be down too
            task.attempts, task.released_ms = task.attempts - 1, 0
            if task.attempts == 0:
                task.first_released_ms = 0
            self.timetable.retry_later(task.key, now + 1000)
        for task, error in failed:
            self.store.mark_retry(task.stored, task.attempts, now + 1000, f"broker: {error}", now)

    def _unsettled(self, tasks: list[Loaded], open_: dict[TaskKey, Loaded]) -> list[Loaded]:
        """*tasks* less those released earlier whose outcome the store has (settled here).

        The statuses of all of them are read in one go: after a takeover, every ordering id
        may start with a task its previous owner released.
        """
        earlier = [task for task in tasks if task.awaiting_outcome]
        if not earlier:
            return tasks
        if not self.outcomes_current():  # their outcomes may be in the topic, unread
            now = self.clock()
            for task in earlier:
                self.timetable.defer(task.key, now + 1000)
                del open_[task.key]
            return [task for task in tasks if not task.awaiting_outcome]
        statuses = self.store.statuses([task.key for task in earlier])
        settled = set()
        for task, status in zip(earlier, statuses, strict=True):
            if self._settle_from_store(task, status):
                settled.add(task.key)
                del open_[task.key]
        return [task for task in tasks if task.key not in settled]

    def _outcome_stored(self, task: Loaded, status: TaskStatus | None) -> bool:
        """Apply the outcome the worker stored for *task*'s current attempt, if there is one."""
        if status is None or not status.outcome or status.outcome_attempt != task.attempts:
            return False
        task.started_ms, task.finished_ms = status.started_ms, status.finished_ms
        self._apply_outcome(task, status.outcome == "succeeded", status.last_error)
        return True

    def _settle_from_store(self, task: Loaded, status: TaskStatus | None) -> bool:
        """A task released earlier whose lease ran out: did its outcome reach the store?"""
        if self._outcome_stored(task, status):
            return True
        if status is not None and (status.state.finished or status.state is State.CANCELLED):
            self._drop(task.key)
            return True
        if task.attempts >= self._max_attempts(task):
            self._apply_outcome(task, False, "lease expired without an outcome")
            return True
        return False

    def _poll_outcomes(self) -> None:
        """Ask the store about released tasks whose outcome has not come.

        Outcomes come from the outcomes topic, so a task this engine released is asked about
        only when its lease ends (then released again if none was stored). A task a previous
        owner released may have had its outcome stored by that owner, or read again here
        before the task was loaded: it is asked about once soon after loading, and again when
        its lease ends.
        """
        now = self.clock()
        if now - self._last_poll_ms < min(500, self.settings.outcome_poll_seconds * 1000):
            return
        self._last_poll_ms = now
        first = int(self.settings.outcome_poll_seconds * 1000)
        asking: list[Loaded] = []
        for task in self.timetable.awaiting():
            if task.key in self._succeeded:
                continue
            if task.next_poll_ms == 0:
                task.next_poll_ms = task.lease_until_ms if task.released_ms else now + first
            if now < task.next_poll_ms:
                continue
            task.next_poll_ms = task.lease_until_ms if task.lease_until_ms > now else now + first
            asking.append(task)
        for start in range(0, len(asking), self.settings.release_batch):
            chunk = asking[start:start + self.settings.release_batch]
            for task, status in zip(chunk, self.store.statuses([t.key for t in chunk]), strict=True):
                self._settle_polled(task, status, now)

    def _settle_polled(self, task: Loaded, status: TaskStatus | None, now: int) -> None:
        if self._outcome_stored(task, status):
            return
        if status is not None and status.state is State.CANCELLED:
            # A cancel overwritten by this release's marking, settled since by a reader of
            # the row it left (see settled_state): a released key is never cancelled
            # otherwise. Releasing it again would run a task reported as cancelled.
            logger.info("%s was settled as cancelled while released; dropping it", task.key)
            self._drop(task.key)
            return
        if task.released_ms and now >= task.lease_until_ms:
            if not self.outcomes_current():
                task.next_poll_ms = now + 1000  # its outcome may be in the topic, unread
                return
            logger.warning("no outcome for %s within its lease; releasing it again", task.key)
            self._apply_outcome(task, False, "lease expired without an outcome")

    def _store_succeeded(self) -> None:
        """Record the tasks that succeeded since the last call, then forget them.

        If the store fails they stay in flight, and are tried again at the next call.
        """
        if not self._succeeded:
            return
        tasks = list(self._succeeded.values())
        self.store.finish_many([task.stored for task in tasks], State.SUCCEEDED, self.clock(),
                               {task.key: task.run for task in tasks})
        self._succeeded.clear()
        for task in tasks:
            if self.timetable.get(task.key) is task:  # not dropped by a revocation meanwhile
                self.timetable.remove(task.key)
            self.completed_count += 1
            self.metrics.finished("succeeded")

    def _max_attempts(self, task: Loaded) -> int:
        return task.envelope.retry.max_attempts

    def _apply_outcome(self, task: Loaded, succeeded: bool, error: str | None) -> None:
        now = self.clock()
        self._window.finished()
        partition = self.partitions.get(task.partition)
        if partition is not None:
            partition.loader.room_freed()  # more may be loaded
        if succeeded:
            # Stored with the others of this step, in one round trip (_store_succeeded); its
            # ordering id stays blocked until then.
            self._succeeded[task.key] = task
            self.timetable.hold(task.key)
            return
        policy = task.envelope.retry
        if task.attempts < policy.max_attempts:
            backoff = min(policy.backoff_max, policy.backoff * 2 ** (task.attempts - 1))
            delay_ms = int(backoff * random.uniform(0.5, 1.0) * 1000)  # jitter
            self.store.mark_retry(task.stored, task.attempts, now + delay_ms, error, now)
            self.timetable.retry_later(task.key, now + delay_ms)
            task.released_ms = task.next_poll_ms = 0
            self.metrics.retried()
            logger.info("attempt %d of %s failed (%s); retrying in %.1fs", task.attempts, task.key,
                        error, delay_ms / 1000)
            return
        block = self.settings.on_exhausted == "block"
        self.metrics.finished("failed")
        self.store.finish(task.stored, State.FAILED, error, now, keep_row=block, run=task.run)
        if block:
            self.timetable.block(task.key)
            logger.error("%s failed %d times; its ordering id is blocked until it is cancelled",
                         task.key, task.attempts)
        else:
            self.timetable.remove(task.key)
            self.completed_count += 1
            logger.error("%s failed %d times; giving up", task.key, task.attempts)
