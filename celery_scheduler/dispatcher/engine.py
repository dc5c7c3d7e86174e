"""The release engine: one thread that owns everything a dispatcher holds in memory.

It receives events (partitions assigned or revoked, tasks persisted or cancelled by the
ingest loop, outcomes reported by workers) on a queue, and in between:

1. takes and renews the lease of every assigned partition (fencing: it releases from a
   partition only while its lease is certainly valid by its own monotonic clock; and the
   ingest loop of its process does not write a partition's new tasks while another
   dispatcher holds its lease, so the tasks of a partition reach the engine that releases
   from it);
2. loads each leased partition's schedule forward (bounded, see ``loader``);
3. releases due tasks, at most one in flight per ordering id, to Celery, but none that the
   operators' pauses hold (read every few seconds, see ``pausing``);
4. acts on outcomes, read from the outcomes topic: success finishes the key and frees its
   ordering id; failure retries with jittered exponential backoff or, after the last
   attempt, fails (or blocks) it; a task whose outcome does not arrive before its lease
   ends is released again. Once an outcome's effect is stored, its offset may be committed.

Flow control: at most a window of tasks is in flight (released and not finished) at once,
so a backlog waits here, oldest first, rather than in the broker's queue, where a task
could outlive its lease before a worker takes it. The window follows the rate at which
outcomes come back (``max_in_flight`` fixes it instead). Owning all state in one thread
keeps the ordering rules free of locks.
"""

from __future__ import annotations

import collections
import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from celery_scheduler.clock import Clock, now_ms
from celery_scheduler.dispatcher.cancels import Cancels
from celery_scheduler.dispatcher.caught_up import CaughtUp
from celery_scheduler.dispatcher.claims import Claims
from celery_scheduler.dispatcher.leases import Leases
from celery_scheduler.dispatcher.limiting import LimitWatch
from celery_scheduler.dispatcher.loader import PartitionLoader
from celery_scheduler.dispatcher.ontime import OnTimeSender
from celery_scheduler.dispatcher.pace import Switching, Watch, Window
from celery_scheduler.dispatcher.pausing import PauseWatch
from celery_scheduler.dispatcher.releasing import Releaser
from celery_scheduler.dispatcher.settling import Settler
from celery_scheduler.dispatcher.state import (
    Assigned,
    Cancelled,
    EngineSettings,
    Event,
    Partition,
    Persisted,
    PrepareMany,
    PublishMany,
    PublishPrepared,
    Revocation,
    Sent,
)
from celery_scheduler.dispatcher.timetable import Loaded, Timetable
from celery_scheduler.errors import SchedulerError, StoreUnavailableError
from celery_scheduler.keys import TaskKey
from celery_scheduler.metrics import Metrics
from celery_scheduler.outages import Outages
from celery_scheduler.release import publish_each
from celery_scheduler.store.base import ScheduleStore, StoredTask
from celery_scheduler.wire import Outcome, OutcomeBatch, Release

__all__ = ["Engine", "EngineSettings"]

logger = logging.getLogger(__name__)

Publish = Callable[[Loaded, Release], None]


class Engine:
    """Loads, releases and completes tasks for the partitions this dispatcher owns."""

    def __init__(self, store: ScheduleStore, publish: Publish, owner: str,
                 settings: EngineSettings | None = None,
                 clock: Clock | None = None, metrics: Metrics | None = None,
                 publish_many: PublishMany | None = None,
                 sends_early: Callable[[Loaded], bool] | None = None,
                 prepare_many: PrepareMany | None = None,
                 publish_prepared: PublishPrepared | None = None,
                 confirm: Callable[[float], None] | None = None,
                 switch_interval: Callable[[float], None] | None = None,
                 rng: random.Random | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.publish = publish
        # the dispatcher sends a step's releases in one round trip where the broker allows
        self.publish_many: PublishMany = publish_many or (lambda items: publish_each(self.publish, items))
        self.owner = owner
        self.settings = settings or EngineSettings()
        # The engine's only sources of time and chance: the wall clock (epoch ms, what tasks
        # are due by), a monotonic clock (seconds, what leases are measured by) and the
        # random source of retry jitter.
        self.clock = clock or now_ms
        self._monotonic = monotonic
        self._rng = rng or random.Random()
        self.timetable = Timetable()
        # the operators' pauses, read every few seconds; everything is held until first read
        self.pauses = PauseWatch(store, monotonic=monotonic)
        self.timetable.hold_by(self.pauses.held)
        # keys the ingest loop is deciding: not marked released meanwhile (see claims.py)
        self.claims = Claims()
        self.metrics = metrics or Metrics()
        self.partitions: dict[int, Partition] = {}
        # the operators' rate limits, and this dispatcher's share of a task name's (limits.py)
        self.limits = LimitWatch(self.pauses, self.timetable, self.partitions, self.metrics)
        self.events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self.stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_loop_mono = self._monotonic()
        # the leases of the partitions assigned, taken, renewed and let go (leases.py)
        self.leases = Leases(store, self.settings, owner, self.clock, monotonic, self.partitions,
                             self.timetable)
        self._watch = Watch()
        self._window = Window(self.settings.max_in_flight)
        # the interpreter's switch interval, given the setter (a dispatcher's own process)
        self._switching = Switching(switch_interval)
        # how far ahead of its due time a release is marked (scheduler_release_ahead_seconds)
        self._ahead_ms = int(self.settings.release_ahead_seconds * 1000)
        # outcomes, beats and leases that end without an outcome (settling.py)
        self.settler = Settler(store, self.settings, self.clock, self.timetable, self.partitions,
                               self.metrics, self._window, self._rng, self._ahead_ms)
        # cancels the ingest loop applied, dropped once the store confirms them (cancels.py)
        self.cancels = Cancels(store, self.claims, self.timetable, self.settler.drop, self.clock)
        # Releases marked ahead of their due time are sent by a thread of their own (ontime.py),
        # which builds their messages while they wait, given prepare_many and publish_prepared.
        # What the sender sent, all of it taken by the broker: counted at the next step, which
        # it need not wake (a release that was not, or may not have been, sent does).
        self._sent_quietly: collections.deque[Sent] = collections.deque()
        self._sender = (OnTimeSender(self.publish_many, self._reported, self.leases.certain, self.clock,
                                     self.settings.release_batch, prepare_many=prepare_many,
                                     publish_prepared=publish_prepared, confirm=confirm)
                        if self._ahead_ms > 0 else None)
        # what is due taken, marked and sent (releasing.py)
        self.releaser = Releaser(store, self.settings, self.clock, self.timetable, self.partitions,
                                 self.leases, self.settler, self.claims, self._window,
                                 self._switching, self.metrics, self._publish_many,
                                 sends_early or (lambda task: False), self._sender, self._ahead_ms)

    # --- called from other threads -------------------------------------------------------

    def _reported(self, event: Sent) -> None:
        """The sender's report of a hand-over (its thread)."""
        if all(error is None for _, error in event.results):
            self._sent_quietly.append(event)
        else:
            self.events.put(event)

    def assign(self, partitions: Iterable[int]) -> None:
        self.events.put(Assigned(tuple(partitions)))

    def revoke(self, partitions: Iterable[int], timeout: float = 30.0) -> bool:
        """Stop releasing from *partitions* and give their leases up; wait until done."""
        request = Revocation(list(partitions))
        if self._thread is None or not self._thread.is_alive():
            self._revoke(request)
            return True
        self.events.put(request)
        return request.done.wait(timeout)

    def persisted(self, task: StoredTask) -> None:
        self.events.put(Persisted(task))

    def cancelled(self, key: TaskKey) -> None:
        self.events.put(Cancelled((key,)))

    def cancelled_many(self, keys: Sequence[TaskKey]) -> None:
        """The ingest loop applied cancels (or moves) of *keys*: one event, one status read
        of those loaded."""
        if keys:
            self.events.put(Cancelled(tuple(keys)))

    def durable_outcome_offsets(self) -> dict[int, int]:
        """Per partition, the outcomes offset up to which every outcome's effect is stored
        (read by the outcome reader's thread, which commits it)."""
        return self.settler.durable_outcome_offsets()

    @property
    def completed_count(self) -> int:
        """Keys finished here: succeeded, or failed for good."""
        return self.settler.completed_count

    def hears(self, *, caught_up: CaughtUp | None = None,
              outcomes_read_until: Callable[[int], int] | None = None) -> None:
        """Judge by what the readers have read: what the ingest loop has applied, per
        partition (caught_up.py: a task waits for its partition's), and the time (ms) before
        which every outcome reported has been read (a lease is judged once that is past it)."""
        if caught_up is not None:
            self.releaser.caught_up = caught_up
        if outcomes_read_until is not None:
            self.settler.expiry.outcomes_read_until = outcomes_read_until

    def _publish_many(self, items: list[tuple[Loaded, Release]]) -> list[Exception | None]:
        return self.publish_many(items)  # looked up at each call: tests replace it

    @property
    def release_ahead_ms(self) -> int:
        """How long before its due time a task may be marked released (ms)."""
        return self._ahead_ms

    @property
    def partition_count(self) -> int:
        """The scheduler topic's partitions (0: unknown), for this dispatcher's share of a
        task name's rate limit."""
        return self.limits.partition_count

    @partition_count.setter
    def partition_count(self, count: int) -> None:
        self.limits.partition_count = count

    @property
    def released_count(self) -> int:
        """Releases sent (taken by the broker, or maybe taken)."""
        return self.releaser.released_count

    def may_persist(self, partition: int) -> bool:
        """Whether this process may write *partition*'s new tasks (see :class:`Leases`)."""
        return self.leases.may_persist(partition)

    def leased(self) -> frozenset[int]:
        """The partitions this process holds the lease of (any thread)."""
        return self.leases.leased()

    def ingest_alive(self) -> None:
        """Called by the ingest loop on every pass (see ``ingest_stall_seconds``)."""
        self.leases.ingest_alive()

    def write_fence(self, partition: int) -> float | None:
        """The wall-clock time this process's writes of *partition* must not be stamped
        after (see :meth:`Leases.write_fence`). Called from the store's threads."""
        return self.leases.write_fence(partition)

    def outcome(self, outcome: Outcome) -> None:
        self.outcomes(OutcomeBatch([outcome], {}))

    def outcomes(self, batch: OutcomeBatch) -> None:
        self.events.put(batch)

    def start(self) -> threading.Thread:
        self._thread = threading.Thread(target=self.run, name="celery-scheduler-engine", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self, timeout: float = 30.0) -> None:
        self.stopped.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._sender is not None:
            self._sender.stop()

    # --- the engine thread ---------------------------------------------------------------

    def run(self) -> None:
        # A store or broker outage (or a bug) must not stop releasing for good: log it, and
        # try again; nothing in memory is lost by a failed step. Each kind of failure is
        # logged when it starts (an outage says all in its message; anything else gets its
        # traceback) and when a step works again, with how many failed in between.
        outages: Outages[str] = Outages()
        while not self.stopped.is_set():
            try:
                self.step()
            except Exception as exc:
                if outages.failed(type(exc).__name__, self._monotonic()):
                    logger.error("dispatcher step failed (%s); retrying every 1s, and saying so "
                                 "once it works again", exc,
                                 exc_info=not isinstance(exc, StoreUnavailableError))
                self._watch.failed += 1
                self.stopped.wait(1.0)
                self._watch.lap("failed")
                continue
            for ended in outages.all_recovered(self._monotonic()) if outages else ():
                logger.warning("dispatcher steps work again (%s): %s", ended.key,
                               ended.describe("they failed"))
        self._revoke(Revocation(list(self.partitions)))

    def step(self) -> None:
        self.last_loop_mono = self._monotonic()
        watch = self._watch
        self._drain_events(self._wait_seconds())
        self.cancels.confirm()
        if self.pauses.refresh(self.clock()):
            self.timetable.hold_by(self.pauses.held)
        self.limits.apply()
        watch.lap("events")
        # Tasks already loaded and due go first: recording successes, lease upkeep and
        # schedule reads are store round trips that would otherwise stand between a due time
        # and its release. An ordering id whose task succeeded stays blocked until its
        # success is recorded (just after, when its next task is due; otherwise once the
        # successes have lingered), and its next task goes at the end of that step.
        self.releaser.release_due()
        self.settler.store_succeeded(lingering=True)
        watch.lap("release")
        now = self.clock()
        self.leases.maintain()
        watch.lap("leases")
        for partition in list(self.partitions.values()):
            if self.leases.may_release(partition) and partition.loader.due_for_fill(now):
                partition.loader.fill(self.timetable, now)
        # A row the fill read may have been written after an earlier task of its ordering id
        # whose place the cursor had passed: that one is known only by its persisted event,
        # already queued (ingest writes an ordering id's tasks in order, each after the
        # events of the one before). Take those events before releasing anything read.
        self._drain_events(0)
        watch.lap("load")
        self.settler.expiry.poll()
        watch.lap("outcomes")
        self.releaser.release_due()
        self.settler.store_succeeded(lingering=True)
        self.settler.outcomes_stored()
        watch.lap("release")
        self.metrics.state(len(self.timetable), self.timetable.in_flight_count(),
                           sum(1 for p in self.partitions.values() if p.lease is not None))
        self.metrics.held(self.timetable.held_count())
        self.limits.report()
        watch.step_done(self)

    def _wait_seconds(self) -> float:
        now = self.clock()
        wait_ms = int(self.settings.tick_seconds * 1000)
        store_by = self.settler.store_by_ms()
        if store_by is not None:
            wait_ms = min(wait_ms, store_by - now)
        next_take = self.releaser.next_take_ms()
        if next_take is not None and self.timetable.in_flight_count() < self._window.size():
            wait_ms = min(wait_ms, next_take - now)
        return max(0.0, wait_ms / 1000)

    def _drain_events(self, wait: float) -> None:
        while self._sent_quietly:
            sent = self._sent_quietly.popleft()
            self.releaser.sent(sent.results, sent.sent_ms)
        self.settler.retry_outcomes()
        try:
            event = self.events.get(timeout=wait) if wait > 0 else self.events.get_nowait()
        except queue.Empty:
            return
        for _ in range(10_000):
            self._handle(event)
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                return

    def _handle(self, event: Event) -> None:
        if isinstance(event, Assigned):
            # A partition still held (kept through a lost group session) stays as it is.
            new = [number for number in event.partitions if number not in self.partitions]
            s = self.settings
            for number in new:
                self.partitions[number] = Partition(PartitionLoader(
                    self.store, number, page_size=s.page_size, max_loaded=s.max_loaded,
                    lookahead_ms=int(s.lookahead_seconds * 1000)))
            # the reader starts again from the committed offset
            self.settler.assigned(new)
            logger.info("assigned partitions %s", sorted(event.partitions))
        elif isinstance(event, Revocation):
            self._revoke(event)
        elif isinstance(event, Persisted):
            if (partition := self.partitions.get(event.row.partition)) is not None:
                partition.loader.persisted(event.row, self.timetable)
        elif isinstance(event, Cancelled):
            self.cancels.cancelled_many(event.keys)
        elif isinstance(event, Sent):
            self.releaser.sent(event.results, event.sent_ms)
        else:
            self.settler.on_outcomes(event)

    def _revoke(self, request: Revocation) -> None:
        # Whatever fails on the way, every partition is given up: one still held here would
        # have its lease renewed while Kafka gives its records to another dispatcher, whose
        # tasks would then wait for the caught-up gate.
        try:
            if self._sender is not None:
                # what was marked ahead goes at its due time, while the leases are still ours
                self._sender.settle(request.partitions, self._ahead_ms / 1000 + 5.0)
            self.settler.store_succeeded()  # while the leases are still ours
            self.settler.outcomes_stored()  # so the reader commits them before it lets go
        except SchedulerError:
            logger.warning("could not record finished tasks before a revocation", exc_info=True)
        finally:
            self._give_up(request)

    def _give_up(self, request: Revocation) -> None:
        gone = set(request.partitions)
        self.settler.forget_partitions(gone)
        self.leases.give_up(request.partitions)
        dropped = self.timetable.drop_partitions(request.partitions)
        self.claims.forget_partitions(request.partitions)
        self.cancels.forget_partitions(gone)
        logger.info("revoked partitions %s (%d tasks dropped from memory)",
                    sorted(request.partitions), dropped)
        request.done.set()
