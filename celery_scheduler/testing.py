"""Unit-test application code that schedules tasks: the real dispatcher, in memory.

::

    from celery_scheduler.testing import scheduler_testing

    def test_signup_schedules_a_reminder():
        with scheduler_testing(app) as scheduler:
            handle = signup("customer-42")          # calls send_reminder.schedule_in(3600, ...)
            assert scheduler.advance(3599) == []    # not due yet
            [run] = scheduler.advance(1)            # due: runs in this process
            assert run.succeeded and run.key == handle.key
            assert handle.status().state.value == "succeeded"

Inside the block every schedule and cancel call of *app* goes to an in-memory task log
that validates and encodes exactly as the real one does, so bad input raises the same
errors it would in production. Time is a fake clock that starts at the real time and moves
only with :meth:`SchedulerTesting.advance`. Each advance lets the dispatcher's own ingest
loop and release engine (over the in-memory store) do what they would do in that time, and
runs every task they release in this process, as a worker would (``task.apply``): one at a
time per ordering id and in order, retried after the backoff of its retry policy when it
raises, never again once it finished, and not at all once cancelled.

``pending()`` and ``run_due()`` are the quick path: they read what was scheduled and run it
eagerly, without the engine's rules.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kombu.utils.json import loads as kombu_loads

from celery_scheduler.client import SchedulerClient, begin_testing, end_testing, set_client
from celery_scheduler.clock import FakeClock, now_ms
from celery_scheduler.config import get_settings
from celery_scheduler.decoding import decode
from celery_scheduler.dispatcher.engine import Engine
from celery_scheduler.dispatcher.firer import firer_of
from celery_scheduler.dispatcher.ingest import Ingest
from celery_scheduler.dispatcher.service import engine_settings
from celery_scheduler.dispatcher.timetable import Loaded
from celery_scheduler.envelope import CancelEnvelope, RescheduleEnvelope, RetryEnvelope, ScheduleEnvelope
from celery_scheduler.errors import SchedulerError
from celery_scheduler.keys import TaskKey, from_epoch_ms
from celery_scheduler.messages import MESSAGE_TASK, DelayedMessage
from celery_scheduler.release import CELERY_RETRIES_EXHAUSTED
from celery_scheduler.store.base import State
from celery_scheduler.store.memory import MemoryScheduleStore
from celery_scheduler.tasklog.dead_letters import MemoryDeadLetters
from celery_scheduler.tasklog.memory import MemoryTaskLog, MemoryTaskLogReader
from celery_scheduler.wire import Outcome, Release

__all__ = ["Execution", "SchedulerRecorder", "SchedulerTesting", "scheduler_testing"]

logger = logging.getLogger(__name__)

# How far ahead the engine loads the schedule, and so the longest single jump of the clock.
LOOKAHEAD_SECONDS = 7 * 24 * 3600
HELD_SECONDS = 10 * 365 * 24 * 3600.0
# Rounds of ingest, release and run at one instant before it counts as a loop (a task that
# schedules itself for now, forever).
MAX_ROUNDS = 10_000


@dataclass(frozen=True)
class Execution:
    """One run of a released task: which key and attempt, when, and Celery's eager result."""

    envelope: ScheduleEnvelope
    attempt: int
    at: dt.datetime  # the fake clock's time when it ran
    result: Any  # celery.result.EagerResult

    @property
    def key(self) -> TaskKey:
        return self.envelope.key

    @property
    def succeeded(self) -> bool:
        return bool(self.result.state == "SUCCESS")


class SchedulerTesting:
    """What the application scheduled and cancelled, and a dispatcher that runs it."""

    def __init__(self, app: Any, task_log: MemoryTaskLog, store: MemoryScheduleStore,
                 clock: FakeClock) -> None:
        self.app = app
        self.task_log = task_log
        self.store = store
        self.clock = clock
        self.executions: list[Execution] = []  # every run so far, in order
        # delayed Kafka messages (schedule_message) "produced", with when, in order
        self.messages: list[tuple[dt.datetime, DelayedMessage]] = []
        self._finished: set[TaskKey] = set()  # run by run_due()
        self._released: list[tuple[Loaded, Release]] = []
        settings = get_settings(app)
        self._dead_letters = MemoryDeadLetters()
        self._reader = MemoryTaskLogReader(task_log, settings.kafka_topic)
        # Real time barely moves while the fake clock jumps: the partition leases (counted
        # in real time) are held for good, and the engine never waits.
        self.engine = Engine(store, self._publish, "testing", dataclasses.replace(
            engine_settings(settings), tick_seconds=0, lookahead_seconds=LOOKAHEAD_SECONDS,
            partition_lease_seconds=HELD_SECONDS, ingest_stall_seconds=HELD_SECONDS,
            # released and stored within run_due(), on this thread
            release_ahead_seconds=0, finish_linger_seconds=0),
            clock=clock)
        self.engine.pauses.every_ms = 0  # a pause or resume holds from the next step on
        self._ingest = Ingest(self._reader, store, self.engine, self._dead_letters,
                              task_log.partitions, allowed=lambda name: name in app.tasks,
                              clock=clock)
        self.engine.assign(range(task_log.partitions()))
        # beat_schedule's entries, fired as the dispatcher fires them (scheduler_periodic), each
        # occurrence written at its time: advance() runs it on the way all the same
        at_its_time = dataclasses.replace(settings, periodic_ahead_seconds=0)
        self._firer = firer_of(app, at_its_time, store, self._ingest.apply, lambda partition: True,
                               task_log.partitions(), clock, changes_every_ms=0)

    # --- time ------------------------------------------------------------------------------

    @property
    def now(self) -> dt.datetime:
        """The fake clock's time (aware, UTC)."""
        return from_epoch_ms(self.clock.ms)

    def advance(self, by: float | dt.timedelta) -> list[Execution]:
        """Move the clock *by* seconds (or a timedelta), running what falls due on the way.

        Returns the runs, in the order they happened. A task released at a time on the way
        runs at that time, so a retry whose backoff ends before the new time runs too.
        """
        seconds = by.total_seconds() if isinstance(by, dt.timedelta) else by
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not (
                math.isfinite(seconds) and seconds >= 0):
            raise SchedulerError(f"advance() takes a number of seconds >= 0 or a timedelta, "
                                 f"got {by!r}")
        target = self.clock.ms + int(seconds * 1000)
        first = len(self.executions)
        while True:
            self._settle()
            step_to = self._next_event_ms()
            if step_to > target:
                break
            self.clock.ms = step_to
        self.clock.ms = target
        self._settle()
        return self.executions[first:]

    def _next_event_ms(self) -> int:
        """When something may happen next: a head falls due, or a released task's lease ends
        (the engine then asks the store for its outcome); never past what the engine loaded.

        A head due already is one the engine cannot release yet (all the tasks it may have
        in flight are out): only time, or an outcome, changes that.
        """
        now = self.clock.ms
        times = [now + LOOKAHEAD_SECONDS * 1000]
        head = self.engine.timetable.next_due_ms()
        if head is not None and head > now:
            times.append(head)
        fires = self._firer.plan.next_at() if self._firer is not None else None
        if fires is not None:  # when a dispatcher writes the next occurrence
            times.append(max(now + 1, fires))
        times += [task.lease_until_ms for task in self.engine.timetable.awaiting()
                  if task.lease_until_ms > now]
        return min(times)

    def _settle(self) -> None:
        """Ingest, release and run until nothing more happens at the current time."""
        for _ in range(MAX_ROUNDS):
            while (self._reader.lag() or self._ingest.carrier) and self._ingest.poll_once(0):
                pass
            if self._firer is not None:
                self._firer.step()
            self._raise_dead_letters()
            self.engine.step()
            released, self._released = self._released, []
            for task, release in released:
                self._run(task, release)
            if (not released and self.engine.events.empty() and not self._reader.lag()
                    and not self._ingest.carrier):
                return
        raise SchedulerError(f"tasks kept falling due at {self.now.isoformat()} for "
                             f"{MAX_ROUNDS} rounds: does a task schedule itself for now?")

    def _raise_dead_letters(self) -> None:
        if self._dead_letters.sent:
            record, reason = self._dead_letters.sent[0]
            self._dead_letters.sent.clear()
            raise SchedulerError(f"a dispatcher would refuse the record at partition "
                                 f"{record.partition} offset {record.offset}: {reason}")

    # --- the worker ------------------------------------------------------------------------

    def _publish(self, task: Loaded, release: Release) -> None:
        self._released.append((task, release))

    def _run(self, task: Loaded, release: Release) -> None:
        envelope = task.envelope
        if envelope.task == MESSAGE_TASK:  # produced: Kafka's acknowledgement is the outcome
            self.messages.append((self.now, DelayedMessage.of(envelope)))
            self.engine.outcome(Outcome(envelope.key, release.partition, release.attempt, True, None))
            return
        if envelope.key in self._finished:  # run_due() ran it already
            self.engine.outcome(Outcome(envelope.key, release.partition, release.attempt, True, None))
            return
        result = _apply(self.app, envelope, retries=CELERY_RETRIES_EXHAUSTED)
        self.executions.append(Execution(envelope, release.attempt, self.now, result))
        if result.state == "SUCCESS":
            outcome = Outcome(envelope.key, release.partition, release.attempt, True, None)
        elif result.state == "FAILURE":
            error = result.result
            outcome = Outcome(envelope.key, release.partition, release.attempt, False,
                              f"{type(error).__name__}: {error}")
        else:  # ignored or rejected: a worker reports a failed attempt for it
            outcome = Outcome(envelope.key, release.partition, release.attempt, False,
                              f"the task raised {'Reject' if result.state == 'REJECTED' else 'Ignore'}")
        self.engine.outcome(outcome)

    # --- what was scheduled ----------------------------------------------------------------

    def records(self) -> list[ScheduleEnvelope | CancelEnvelope | RescheduleEnvelope]:
        """Every schedule, cancel and reschedule record, in the order each partition
        received them."""
        return [record for record in (decode(value) for _, value in self.task_log.records())
                if not isinstance(record, RetryEnvelope)]

    def pending(self) -> list[ScheduleEnvelope]:
        """Tasks that would still run: latest record per key, minus cancelled and finished."""
        latest: dict[TaskKey, ScheduleEnvelope] = {}
        for record in self.records():
            if isinstance(record, CancelEnvelope):
                latest.pop(record.key, None)
            elif isinstance(record, RescheduleEnvelope):
                if latest.pop(record.key, None) is not None and record.to.key not in self._finished:
                    latest[record.to.key] = record.to
            elif record.key not in self._finished:
                latest[record.key] = record
        for key in list(latest):
            status = self.store.status(key)
            if status is not None and (status.state.finished or status.state is State.CANCELLED):
                del latest[key]
        return sorted(latest.values(), key=lambda e: (e.key.scheduled_ms, e.key.ordering_id))

    def cancelled(self) -> list[TaskKey]:
        return [r.key for r in self.records() if isinstance(r, CancelEnvelope)]

    def run_due(self, until_ms: int | None = None) -> list[Any]:
        """Run pending tasks due by *until_ms* (default: all) eagerly, in time order.

        Returns the Celery ``EagerResult`` of each; arguments arrive decoded as a worker
        would see them. No ordering, retry or cancel rules apply: :meth:`advance` has them.
        A delayed Kafka message goes to :attr:`messages` instead.
        """
        results = []
        for envelope in self.pending():
            if until_ms is not None and envelope.key.scheduled_ms > until_ms:
                break
            if envelope.task == MESSAGE_TASK:
                self.messages.append((self.now, DelayedMessage.of(envelope)))
            else:
                results.append(_apply(self.app, envelope))
            self._finished.add(envelope.key)
        return results

    def run_due_now(self) -> list[Any]:
        """Run the pending tasks whose time has come by the fake clock."""
        return self.run_due(self.clock.ms)


# The name this class had before it ran the engine.
SchedulerRecorder = SchedulerTesting


def _apply(app: Any, envelope: ScheduleEnvelope, **options: Any) -> Any:
    """Run *envelope*'s task in this process, with its arguments decoded as a worker would."""
    args, kwargs = kombu_loads(json.dumps([envelope.args, envelope.kwargs]))
    task = app.tasks[envelope.task]
    return task.apply(args, kwargs, task_id=envelope.task_id, throw=False, **options)


@contextlib.contextmanager
def scheduler_testing(app: Any, partitions: int = 12, start: dt.datetime | None = None
                      ) -> Iterator[SchedulerTesting]:
    """Route *app*'s schedule calls to memory, and run them there, for the block's duration.

    The fake clock starts at *start* (an aware datetime; default: now).
    """
    settings = get_settings(app)
    clock = FakeClock(now_ms() if start is None else _epoch_ms(start))
    task_log = MemoryTaskLog(partitions)
    store = MemoryScheduleStore(settings.bucket_seconds)
    previous = set_client(app, SchedulerClient(settings, task_log=task_log, store=store, clock=clock))
    begin_testing(app)  # and any other app's call is refused meanwhile
    try:
        yield SchedulerTesting(app, task_log, store, clock)
    finally:
        end_testing(app)
        set_client(app, previous)


def _epoch_ms(start: dt.datetime) -> int:
    if start.tzinfo is None:
        raise SchedulerError(f"start must be an aware datetime, got the naive {start!r}")
    return int(start.timestamp() * 1000)
