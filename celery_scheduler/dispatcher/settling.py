"""How outcomes settle tasks: success finishes a key and frees its ordering id; failure is
retried with jittered exponential backoff or, after the last attempt, fails or blocks the
key. Beats keep a running task's lease (see :mod:`celery_scheduler.heartbeat`); a task whose
lease ends without an outcome is judged by :mod:`~celery_scheduler.dispatcher.expiry`.
Once an outcome's effect is stored, its offset may be committed, but never past the latest
beat of a task still running, so that the partition's next owner hears it too.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

from celery_scheduler.dispatcher import rules
from celery_scheduler.dispatcher.beats import Beats
from celery_scheduler.dispatcher.expiry import Expiry, Settling
from celery_scheduler.dispatcher.pace import Window
from celery_scheduler.dispatcher.state import EngineSettings, Partition
from celery_scheduler.dispatcher.timetable import Loaded, Timetable
from celery_scheduler.errors import SchedulerError, StoreUnavailableError
from celery_scheduler.keys import TaskKey
from celery_scheduler.metrics import Metrics
from celery_scheduler.store.base import RunTimes, ScheduleStore, State
from celery_scheduler.wire import Outcome, OutcomeBatch

__all__ = ["Settler"]

logger = logging.getLogger("celery_scheduler.dispatcher.engine")  # its lines are the engine's


# Outcomes whose effect could not be stored are tried again after this long, doubling up to
# the second while the store keeps refusing: not at every turn of the loop, each with a
# traceback (thousands of log lines a minute while Cassandra was down), and not so rarely
# that the ordering ids they hold wait long once it is back.
OUTCOME_RETRY_MS = (250, 1000)
class Settler:
    """What the engine does with outcomes, beats and leases that end: its own state (the
    outcomes read, the successes not yet stored, the beats heard), and what it shares with
    the engine (the timetable, the partitions, the flow-control window), which it is given.

    The engine calls it from its own thread only.
    """

    def __init__(self, store: ScheduleStore, settings: EngineSettings, clock: Callable[[], int],
                 timetable: Timetable, partitions: dict[int, Partition], metrics: Metrics,
                 window: Window, rng: random.Random, ahead_ms: int) -> None:
        self.store = store
        self.settings = settings
        self.clock = clock
        self.timetable = timetable
        self.partitions = partitions
        self.metrics = metrics
        self._window = window
        self._rng = rng
        self._ahead_ms = ahead_ms
        self.completed_count = 0  # keys finished here (succeeded, or failed for good)
        self._succeeded: dict[TaskKey, Loaded] = {}  # finished in memory, not yet in the store
        self._store_succeeded_by_ms = 0  # when those must be stored at the latest
        # Outcomes read from the outcomes topic: the offset read up to, per partition; the
        # outcomes whose effect could not be stored yet; and the offsets whose outcomes'
        # effects are all stored, which the reader may commit (replaced whole, never
        # changed in place: the reader's thread reads it).
        self._outcomes_read: dict[int, int] = {}
        self._outcome_retries: list[Outcome] = []
        self._outcome_retry_ms = 0  # when to try them again
        self._outcome_retry_delay_ms = 0  # the current delay between tries; 0 while none failed
        self._durable_offsets: dict[int, int] = {}
        # the beats of running tasks (beats.py)
        self.beats = Beats(timetable, partitions, clock)
        # leases that end without an outcome (expiry.py)
        self.expiry = Expiry(Settling(store, settings, clock, timetable, self.beats,
                                      self.apply_outcome, self.drop, self.max_attempts,
                                      self.succeeding))

    def durable_outcome_offsets(self) -> dict[int, int]:
        """Per partition, the outcomes offset up to which every outcome's effect is stored."""
        return self._durable_offsets

    def store_by_ms(self) -> int | None:
        """When the successes read so far must be stored at the latest (None: there are none)."""
        return self._store_succeeded_by_ms if self._succeeded else None

    def assigned(self, partitions: list[int]) -> None:
        """*partitions* are (again) this engine's: their outcomes are read from the committed offset."""
        self._durable_offsets = {n: o for n, o in self._durable_offsets.items() if n not in partitions}

    def forget_partitions(self, gone: set[int]) -> None:
        """*gone* are given up: their outcomes and beats are the next owner's."""
        self._outcome_retries = [o for o in self._outcome_retries if o.partition not in gone]
        self.beats.forget_partitions(gone)
        for number in gone:
            self._outcomes_read.pop(number, None)

    def on_outcomes(self, batch: OutcomeBatch) -> None:
        if batch.beats:
            now = self.clock()
            for beat in batch.beats:
                if beat.partition in self.partitions:
                    self.beats.read(beat, now)
        unknown: list[Outcome] = []
        failed: list[Outcome] = []
        error: SchedulerError | None = None
        for outcome in batch.outcomes:
            if outcome.partition not in self.partitions:
                continue
            task = self.timetable.get(outcome.key)
            if task is None:
                unknown.append(outcome)  # not loaded (yet): the store keeps it for the loader
            elif (task.awaiting_outcome and outcome.attempt == task.attempts
                  and outcome.generation in (0, task.lease_until_ms)):
                # also for a task a previous owner released: its outcome frees the ordering id
                task.started_ms, task.finished_ms = outcome.started_ms, outcome.finished_ms
                try:
                    self.apply_outcome(task, outcome.succeeded, outcome.error)
                except SchedulerError as exc:
                    failed.append(outcome)
                    error = error or exc
            # else an older attempt's or release's outcome, or one of a task not released:
            # nothing to do
        if unknown:
            try:
                self.store.record_outcomes([(o.partition, o.key, o.attempt, o.succeeded, o.error,
                                             o.generation)
                                            for o in unknown], self.clock(),
                                           {o.key: RunTimes(0, o.started_ms, o.finished_ms)
                                            for o in unknown})
            except SchedulerError as exc:
                failed += unknown
                error = error or exc
        if error is not None:
            self._outcomes_not_stored(failed, error)
        elif batch.retried:
            self._outcome_retry_delay_ms = 0
        for number, offset in batch.offsets.items():
            if number in self.partitions:
                self._outcomes_read[number] = max(offset, self._outcomes_read.get(number, 0))

    def _outcomes_not_stored(self, failed: list[Outcome], error: SchedulerError) -> None:
        """Keep *failed* to try again, later each time while the store refuses, in one log line."""
        self._outcome_retries += failed
        first, most = OUTCOME_RETRY_MS
        delay = min(most, self._outcome_retry_delay_ms * 2 or first)
        self._outcome_retry_delay_ms = delay
        self._outcome_retry_ms = self.clock() + delay
        # an outage is expected and says all in its message; anything else gets its traceback
        logger.warning("could not store the outcomes of %d task(s), first %s (%s); trying again "
                       "in %.2fs", len(failed), failed[0].key, error, delay / 1000,
                       exc_info=not isinstance(error, StoreUnavailableError))

    def retry_outcomes(self) -> None:
        """Apply the outcomes a failed write did not store, once their retry is due."""
        if self._outcome_retries and self.clock() >= self._outcome_retry_ms:
            retries, self._outcome_retries = self._outcome_retries, []
            self.on_outcomes(OutcomeBatch(retries, {}, retried=True))

    def outcomes_stored(self) -> None:
        """Mark the outcomes read so far durable, where all of a partition's are stored."""
        if not self._outcomes_read:
            return
        held = {o.partition for o in self._outcome_retries}
        held.update(task.partition for task in self._succeeded.values())
        floors = self.beats.floors() if self.beats.beating or self.beats.unloaded else {}
        durable = dict(self._durable_offsets)
        for number, offset in self._outcomes_read.items():
            if number not in held:
                durable[number] = min(offset, floors.get(number, offset))
        self._durable_offsets = durable


    def drop(self, key: TaskKey) -> None:
        """Forget *key* (it will not run here), making room for more of its partition."""
        task = self.timetable.remove(key)
        if task is not None:
            self._room_freed(task.partition)

    def _room_freed(self, number: int) -> None:
        """Tasks of partition *number* left memory: more of it may be loaded."""
        partition = self.partitions.get(number)
        if partition is not None:
            partition.loader.room_freed(self.timetable.count(number))


    def store_succeeded(self, lingering: bool = False) -> None:
        """Record the tasks that succeeded since the last call, then forget them.

        If *lingering*, only once the first of them has waited ``finish_linger_seconds`` or
        the next task of one's ordering id is about to be marked, whichever comes first. If
        the store fails they stay in flight, and are tried again at the next call.
        """
        tasks = self.succeeded_due() if lingering else list(self._succeeded.values())
        if not tasks:
            return
        self.store.finish_many([task.stored for task in tasks], State.SUCCEEDED, self.clock(),
                               {task.key: task.run for task in tasks})
        self.succeeded_stored(tasks)

    def succeeded_due(self) -> list[Loaded]:
        """The successes ``store_succeeded(lingering=True)`` would record now, for a release's
        write to carry (then :meth:`succeeded_stored` once written)."""
        return list(self._succeeded.values()) if self.succeeded_due_count() else []

    def succeeded_due_count(self) -> int:
        """How many successes :meth:`succeeded_due` would give now."""
        return len(self._succeeded) if self.clock() >= self._store_succeeded_by_ms else 0

    def succeeding(self, key: TaskKey) -> bool:
        """Whether *key* succeeded and is not yet recorded as such."""
        return key in self._succeeded

    def succeeded_stored(self, tasks: list[Loaded]) -> None:
        """*tasks*, successes, are recorded in the store: forget them, free their ordering ids."""
        for task in tasks:
            del self._succeeded[task.key]
        for task in tasks:
            if self.timetable.get(task.key) is task:  # not dropped by a revocation meanwhile
                self.timetable.remove(task.key)
            self.completed_count += 1
            self.metrics.finished("succeeded")
        for number in {task.partition for task in tasks}:
            self._room_freed(number)

    def max_attempts(self, task: Loaded) -> int:
        return task.envelope.retry.max_attempts

    def apply_outcome(self, task: Loaded, succeeded: bool, error: str | None) -> None:
        now = self.clock()
        self._window.finished()
        if succeeded:
            # Stored with the others of this step, or of the next few, in one round trip
            # (store_succeeded); its ordering id stays blocked until then.
            self._store_succeeded_by_ms = rules.success_deadline(
                now, int(self.settings.finish_linger_seconds * 1000),
                self.timetable.successor_due_ms(task.key), self._ahead_ms,
                self._store_succeeded_by_ms if self._succeeded else None)
            self._succeeded[task.key] = task
            self.timetable.hold(task.key)
            return
        decision = rules.after_failure(task.attempts, task.envelope.retry, self.settings.on_exhausted,
                                       now, self._rng)
        if isinstance(decision, rules.RetryAt):
            self.store.mark_retry(task.stored, task.attempts, decision.not_before_ms, error, now)
            self.timetable.retry_later(task.key, decision.not_before_ms)
            task.released_ms = task.next_poll_ms = 0
            self.metrics.retried()
            logger.info("attempt %d of %s failed (%s); retrying in %.1fs", task.attempts, task.key,
                        error, decision.delay_ms / 1000)
            return
        block = decision is rules.Exhausted.BLOCK
        self.metrics.finished("failed")
        self.store.finish(task.stored, State.FAILED, error, now, keep_row=block, run=task.run)
        if block:
            self.timetable.block(task.key)
            logger.error("%s failed %d times; its ordering id is blocked until it is cancelled",
                         task.key, task.attempts)
        else:
            self.timetable.remove(task.key)
            self._room_freed(task.partition)
            self.completed_count += 1
            logger.error("%s failed %d times; giving up", task.key, task.attempts)
