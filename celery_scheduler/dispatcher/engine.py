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
from collections.abc import Callable, Iterable

from celery_scheduler.clock import Clock, now_ms
from celery_scheduler.dispatcher.caught_up import CaughtUp
from celery_scheduler.dispatcher.claims import Claims
from celery_scheduler.dispatcher.leases import Leases
from celery_scheduler.dispatcher.loader import PartitionLoader, loaded_from
from celery_scheduler.dispatcher.ontime import OnTimeSender
from celery_scheduler.dispatcher.outcomes import OutcomeBatch
from celery_scheduler.dispatcher.pace import Switching, Watch, Window
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
    Sending,
    Sent,
)
from celery_scheduler.dispatcher.timetable import Loaded, Timetable
from celery_scheduler.errors import ReleaseNotSentError, SchedulerError, StoreUnavailableError
from celery_scheduler.keys import TaskKey
from celery_scheduler.metrics import Metrics
from celery_scheduler.outages import Outages
from celery_scheduler.release import publish_each
from celery_scheduler.store.base import ScheduleStore, State, StoredTask
from celery_scheduler.wire import Outcome, Release

__all__ = ["Engine", "EngineSettings"]

logger = logging.getLogger(__name__)

Publish = Callable[[Loaded, Release], None]
# A task held until its partition's ingest has caught up is looked at again this soon (ms);
# one held for longer than GATE_WARN_MS past its earliest marking is logged, at most every
# GATE_WARN_EVERY_MS.
GATE_RETRY_MS = 50
GATE_WARN_MS = 5_000
GATE_WARN_EVERY_MS = 30_000
# A cancel whose task's status could not be read is read again this often (ms).
CONFIRM_CANCEL_EVERY_MS = 1000


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
        # Whether a task marked ahead may be sent before it is due: its message then carries
        # its due time and the broker's consumer holds it until then (Celery's eta).
        self._sends_early = sends_early or (lambda task: False)
        self.owner = owner
        self.settings = settings or EngineSettings()
        # The engine's only sources of time and chance: the wall clock (epoch ms, what tasks
        # are due by), a monotonic clock (seconds, what leases are measured by) and the
        # random source of retry jitter.
        self.clock = clock or now_ms
        self._monotonic = monotonic
        self._rng = rng or random.Random()
        # a release's start lease, and a running task's run lease (see celery_scheduler.heartbeat)
        self._start_lease_ms = int(self.settings.start_lease_seconds * 1000)
        self._run_lease_ms = int(self.settings.lease_seconds * 1000)
        self.timetable = Timetable()
        # keys the ingest loop is deciding: not marked released meanwhile (see claims.py)
        self.claims = Claims()
        self.metrics = metrics or Metrics()
        self.partitions: dict[int, Partition] = {}
        self.events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self.stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self.released_count = 0
        self.last_loop_mono = self._monotonic()
        # the leases of the partitions assigned, taken, renewed and let go (leases.py)
        self.leases = Leases(store, self.settings, owner, self.clock, monotonic, self.partitions,
                             self.timetable)
        self._watch = Watch()
        self._window = Window(self.settings.max_in_flight)
        # the interpreter's switch interval, given the setter (a dispatcher's own process)
        self._switching = Switching(switch_interval)
        # What the ingest loop has shown it has applied, per partition (caught_up.py): a task
        # is marked released only once every record acknowledged before its earliest marking
        # time is applied, so that a cancel made before then wins. None: records are applied
        # before the engine hears of them (as in memory).
        self.caught_up: CaughtUp | None = None
        self._gate_logged_ms = 0
        # Cancels whose task's status the store could not read: held until it answers.
        self._unconfirmed_cancels: dict[TaskKey, int] = {}
        self._confirm_cancels_ms = 0
        # Releases marked ahead of their due time are sent by a thread of their own (ontime.py).
        self._ahead_ms = int(self.settings.release_ahead_seconds * 1000)
        # outcomes, beats and leases that end without an outcome (settling.py)
        self.settler = Settler(store, self.settings, self.clock, self.timetable, self.partitions,
                               self.metrics, self._window, self._rng, self._ahead_ms)
        # Marking starts once the first task is this close to its due time, and takes every
        # task due within _ahead_ms: the marks of a fifth of a second of due times share
        # requests, instead of each step marking the few that came into reach since the last.
        self._mark_lead_ms = self._ahead_ms * 3 // 5
        # (it builds their messages while they wait, given prepare_many and publish_prepared)
        # What the sender sent, all of it taken by the broker: counted at the next step, which
        # it need not wake (a release that was not, or may not have been, sent does).
        self._sent_quietly: collections.deque[Sent] = collections.deque()
        self._sender = (OnTimeSender(self.publish_many, self._reported, self.leases.certain, self.clock,
                                     self.settings.release_batch, prepare_many=prepare_many,
                                     publish_prepared=publish_prepared, confirm=confirm)
                        if self._ahead_ms > 0 else None)

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
        self.events.put(Cancelled(key))

    def durable_outcome_offsets(self) -> dict[int, int]:
        """Per partition, the outcomes offset up to which every outcome's effect is stored
        (read by the outcome reader's thread, which commits it)."""
        return self.settler.durable_outcome_offsets()

    @property
    def completed_count(self) -> int:
        """Keys finished here: succeeded, or failed for good."""
        return self.settler.completed_count

    @property
    def outcomes_read_until(self) -> Callable[[int], int]:
        """Per partition, the time (ms) before which every outcome reported has been read."""
        return self.settler.outcomes_read_until

    @outcomes_read_until.setter
    def outcomes_read_until(self, read_until: Callable[[int], int]) -> None:
        self.settler.outcomes_read_until = read_until

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
        self._confirm_cancels()
        watch.lap("events")
        # Tasks already loaded and due go first: recording successes, lease upkeep and
        # schedule reads are store round trips that would otherwise stand between a due time
        # and its release. An ordering id whose task succeeded stays blocked until its
        # success is recorded (just after, when its next task is due; otherwise once the
        # successes have lingered), and its next task goes at the end of that step.
        self._release_due()
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
        self.settler.poll_outcomes()
        watch.lap("outcomes")
        self._release_due()
        self.settler.store_succeeded(lingering=True)
        self.settler.outcomes_stored()
        watch.lap("release")
        self.metrics.state(len(self.timetable), self.timetable.in_flight_count(),
                           sum(1 for p in self.partitions.values() if p.lease is not None))
        watch.step_done(self)

    def _wait_seconds(self) -> float:
        now = self.clock()
        wait_ms = int(self.settings.tick_seconds * 1000)
        store_by = self.settler.store_by_ms()
        if store_by is not None:
            wait_ms = min(wait_ms, store_by - now)
        next_take = self.timetable.next_take_ms(self._mark_lead_ms)
        if next_take is not None and self.timetable.in_flight_count() < self._window.size():
            wait_ms = min(wait_ms, next_take - now)
        return max(0.0, wait_ms / 1000)

    def _drain_events(self, wait: float) -> None:
        while self._sent_quietly:
            sent = self._sent_quietly.popleft()
            self._sent(sent.results, sent.sent_ms)
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
            self._on_persisted(event.row)
        elif isinstance(event, Cancelled):
            self._on_cancelled(event.key)
        elif isinstance(event, Sent):
            self._sent(event.results, event.sent_ms)
        else:
            self.settler.on_outcomes(event)

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
        self._unconfirmed_cancels.pop(key, None)
        task = self.timetable.get(key)
        if task is None or self.timetable.is_in_flight(key):
            self.claims.cancel_noted(key)
            return
        # This engine does not mark a task released while its cancel is read and written,
        # nor until it gets here (see claims.py); but a marking by the partition's previous
        # owner may have overwritten the cancel, and then the task must still run. Only a
        # status that is still cancelled drops it. If the store cannot say, the task stays
        # held and its status is read again (_confirm_cancels): released now, it could run
        # though its cancel was written.
        try:
            status = self.store.status(key)
        except SchedulerError:
            self._unconfirmed_cancels[key] = task.partition
            return
        self.claims.cancel_noted(key)
        if status is None or status.state is State.CANCELLED:
            self.settler.drop(key)

    def _confirm_cancels(self) -> None:
        """Read again, each second, the status behind cancels the store could not confirm."""
        now = self.clock()
        if not self._unconfirmed_cancels or now < self._confirm_cancels_ms:
            return
        self._confirm_cancels_ms = now + CONFIRM_CANCEL_EVERY_MS
        for key in list(self._unconfirmed_cancels):
            self._on_cancelled(key)

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
        for number in request.partitions:
            self.leases.let_go(number)
            partition = self.partitions.pop(number, None)
            if partition is not None and partition.lease is not None:
                try:
                    self.store.release_lease(partition.lease)
                except Exception as exc:  # it ends on its own; the others are given up still
                    logger.warning("could not give up the lease of partition %d: %s", number, exc,
                                   exc_info=not isinstance(exc, SchedulerError))
        dropped = self.timetable.drop_partitions(request.partitions)
        self.claims.forget_partitions(request.partitions)
        self._unconfirmed_cancels = {k: p for k, p in self._unconfirmed_cancels.items() if p not in gone}
        logger.info("revoked partitions %s (%d tasks dropped from memory)",
                    sorted(request.partitions), dropped)
        request.done.set()

    # --- release and outcomes -----------------------------------------------------------------

    def _release_due(self) -> None:
        now = self.clock()
        # Successes due to be recorded go in the releases' write (see _release_taken) and
        # leave the window with it: counted as in flight here, a full window would write
        # them alone first and release in a second request.
        room = self._window.size() - self.timetable.in_flight_count() + self.settler.succeeded_due_count()
        if room <= 0:
            return
        next_take = self.timetable.next_take_ms(self._mark_lead_ms)
        if next_take is None or next_take > now:
            self._switching.released(None)
            return
        taken = self.timetable.take_due(now, min(room, self.settings.release_batch), self._ahead_ms)
        if not taken:
            return
        self._switching.released(now - min(task.due_ms for task in taken))
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
            if partition is None or not self.leases.may_release(partition):
                self.timetable.defer(task.key, now + 200)  # lease not (yet) certain
                del open_[task.key]
                continue
            if not self._ingested_before(task, now):
                self.timetable.defer(task.key, now + GATE_RETRY_MS)
                del open_[task.key]
                continue
            ready.append(task)
        ready = self.settler.unsettled(ready, open_)
        if not ready:
            return
        # Keys the ingest loop is putting or cancelling right now are decided once it is done.
        free = self.claims.take_for_release(task.key for task in ready)
        for task in ready:
            if task.key not in free:
                self.timetable.defer(task.key, now + 200)
                del open_[task.key]
        ready = [task for task in ready if task.key in free]
        due = {task.key: task.due_ms for task in ready}
        lease_ms = self._start_lease_ms
        # Successes due to be recorded share the round trip: one wait for both. Their
        # ordering ids stay held until then, so none of them has a task among these.
        finishing = self.settler.succeeded_due()
        try:
            if ready or finishing:
                # Mark them all released (one round trip for the lot), and only then publish:
                # a task another dispatcher could see as not released must not be running.
                # One marked ahead is sent at its due time: its start lease counts from then.
                self.store.mark_released_and_succeeded(
                    [(t.stored, t.attempts + 1, max(now, due[t.key]) + lease_ms) for t in ready],
                    [t.stored for t in finishing], now, {t.key: t.run for t in finishing})
        finally:
            self.claims.marked(free)
        if finishing:
            self.settler.succeeded_stored(finishing)
        if ready:
            self._send_marked(ready, open_, due, now)

    def _ingested_before(self, task: Loaded, now: int) -> bool:
        """Whether every record of *task*'s partition acknowledged before the task could
        first be marked released (its scheduled time less the release-ahead) has been applied."""
        if self.caught_up is None:
            return True
        since = task.key.scheduled_ms - self._ahead_ms
        if self.caught_up.covers(task.partition, since, now):
            return True
        if now - since > GATE_WARN_MS and now - self._gate_logged_ms > GATE_WARN_EVERY_MS:
            self._gate_logged_ms = now
            logger.warning("holding %s (due %.1fs ago) until the ingest loop has read partition "
                           "%d as far as Kafka holds: a cancel of it may still be unread",
                           task.key, (now - task.due_ms) / 1000, task.partition)
        return False

    def _send_marked(self, ready: list[Loaded], open_: dict[TaskKey, Loaded], due: dict[TaskKey, int],
                     now: int) -> None:
        """Publish *ready*, just marked released, each at its *due* time or now if that passed."""
        sending: list[Sending] = []
        lease_ms = self._start_lease_ms
        for task in ready:
            del open_[task.key]
            partition = self.partitions.get(task.partition)
            if partition is None or not self.leases.may_release(partition):  # the marking took long
                self.timetable.defer(task.key, now + 200)
                continue
            assert partition.lease is not None
            attempt, at = task.attempts + 1, max(now, due[task.key])
            task.attempts, task.lease_until_ms, task.released_ms = attempt, at + lease_ms, at
            if attempt == 1 and not task.first_released_ms:  # kept by a release sent again
                task.first_released_ms = at
            task.next_poll_ms, task.heard_ms, task.beat_offset = 0, 0, -1
            release = Release(task.key, task.partition, attempt, partition.lease.epoch, at + lease_ms,
                              due[task.key], self._run_lease_ms, now)
            sending.append(Sending(task, release, due[task.key], self._sends_early(task)))
        if not sending:
            return
        if self._sender is not None:
            self._sender.hand(sending)  # sent on time; Sent comes back as an event
            return
        results = self.publish_many([(item.task, item.release) for item in sending])
        self._sent(list(zip(sending, results, strict=True)), now)

    def _sent(self, results: list[tuple[Sending, Exception | None]], sent_ms: int) -> None:
        """Count what was sent; put back what certainly was not."""
        failed: list[tuple[Loaded, Exception]] = []
        uncertain: list[tuple[Loaded, Exception]] = []
        for item, error in results:
            task, release = item.task, item.release
            if isinstance(error, ReleaseNotSentError):
                # only while it is still this release in flight here (its partition may
                # have been revoked meanwhile: its next owner decides)
                if (self.timetable.get(task.key) is task and self.timetable.is_in_flight(task.key)
                        and task.attempts == release.attempt):
                    failed.append((task, error))
                continue
            if error is not None:
                uncertain.append((task, error))
            self.released_count += 1
            self.metrics.released((sent_ms - item.due_ms) / 1000 if release.attempt == 1 else 0.0)
        if uncertain:
            # Sending it again now could make two copies of one release that run at once,
            # or run beside the next task of the ordering id once the first copy reports: it
            # stays released, and its outcome or the end of its lease decides, as for any.
            logger.warning("%d release(s) may have reached the broker, first %s (%s); waiting "
                           "for their outcome or the end of their lease", len(uncertain),
                           uncertain[0][0].key, uncertain[0][1])
        if failed:
            self.settler.unpublished(failed, sent_ms)
