"""Sending marked releases on time, from a thread of its own.

A task is marked released in the store before anything may run it, and that round trip
waits behind whatever else the engine thread is doing (recording successes, renewing
leases, reading the schedule). Sent the moment it is marked, a task is as late as all of
that. With ``release_ahead_seconds`` the engine marks a task that much before it is due and
hands it here; this thread sends it at its due time, never before, while the engine's next
batch is marked. With ``scheduler_release_eta`` a Celery task is sent at once instead, its
due time as the message's ``eta``: the worker holds it until then, as it holds any task
sent with ``eta=``, so its lateness is the worker's timer's, and the tasks marked together
go to the broker in one round trip. A message for a topic (Kafka delivery) has no such
hold and always waits for its due time here.

Between sends this thread builds the messages of the releases handed to it ahead of their
due time (the Celery message, routed, its body encoded: ``Publisher.prepare_many``), so that
at a due time only the push to the broker is left, and Celery's publish signals, which are
sent then as Celery sends them.

On RabbitMQ a release counts as sent once RabbitMQ confirmed it. This thread does not wait
for that round trip before the next due time: it reads the confirms while it waits, and a
hand-over is reported once all of its releases are settled, still in the order sent.

A release is sent only while its partition's lease is certain (the engine's fence, by this
process's monotonic clock); otherwise it is reported not sent, and the engine puts the task
back, its attempt not spent. Every hand-over is reported to the engine as a
:class:`~celery_scheduler.dispatcher.state.Sent` event, in the order it was sent.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from celery_scheduler.clock import Clock, now_ms
from celery_scheduler.dispatcher.state import PrepareMany, PublishMany, PublishPrepared, Sending, Sent
from celery_scheduler.errors import ReleaseNotSentError, ReleaseUncertainError
from celery_scheduler.release.confirms import Unconfirmed

__all__ = ["OnTimeSender"]

logger = logging.getLogger(__name__)

# Most messages built in one go between sends, so a release due meanwhile is not held up.
PREPARE_CHUNK = 50
# Longest one read of the broker's confirms waits (seconds): how late a release handed over
# already due may be noticed while confirms are awaited.
CONFIRM_SLICE = 0.005
# How long a stopping sender waits for the confirms of what it sent (seconds).
STOP_CONFIRMS_SECONDS = 2.0

# A hand-over sent and not yet reported: the entries, each one's result, when they were sent.
InFlight = tuple[list[list[Any]], list[Exception | Unconfirmed | None], int]


class OnTimeSender:
    """Holds marked releases until they may be sent (:attr:`Sending.send_ms`), then publishes them.

    With *prepare_many* (and *publish_prepared*, which takes what it built), the messages of
    releases handed over ahead of their due time are built as soon as they arrive, a step's
    worth together, and only pushed to the broker at their due time. *publish_prepared* may
    leave a release :class:`Unconfirmed`: *confirm* (seconds to wait at most) then reads the
    broker's answers, which settle it.
    """

    def __init__(self, publish_many: PublishMany, report: Callable[[Sent], None],
                 lease_certain: Callable[[int], bool], clock: Clock | None = None,
                 batch: int = 500, *, prepare_many: PrepareMany | None = None,
                 publish_prepared: PublishPrepared | None = None,
                 confirm: Callable[[float], None] | None = None) -> None:
        if (prepare_many is None) != (publish_prepared is None):
            raise ValueError("prepare_many and publish_prepared go together")
        self._publish_many = publish_many
        self._prepare_many = prepare_many
        self._publish_prepared = publish_prepared
        self._confirm = confirm
        self._in_flight: collections.deque[InFlight] = collections.deque()  # this thread's alone
        self._report = report
        self._lease_certain = lease_certain
        self._clock = clock or now_ms
        self._batch = batch
        # [send_ms, tie, release, its prepared message or None], earliest first
        self._heap: list[list[Any]] = []
        self._fresh: list[list[Any]] = []  # entries whose message is not built yet
        self._tie = itertools.count()
        self._waiting: collections.Counter[int] = collections.Counter()  # per partition, not sent yet
        self._changed = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._serve, name="celery-scheduler-sender", daemon=True)
        self._thread.start()

    def hand(self, items: Iterable[Sending]) -> None:
        """Send each of *items* once it may be (at once if that time has passed)."""
        with self._changed:
            for item in items:
                entry = [item.send_ms, next(self._tie), item, None]
                heapq.heappush(self._heap, entry)
                self._waiting[item.task.partition] += 1
                if self._prepare_many is not None and not item.early:
                    self._fresh.append(entry)
            self._changed.notify_all()

    def waiting(self) -> int:
        """How many releases wait to be sent."""
        with self._changed:
            return len(self._heap)

    def settle(self, partitions: Iterable[int], timeout: float) -> bool:
        """Wait until nothing of *partitions* waits to be sent; False if *timeout* came first."""
        numbers = set(partitions)
        deadline = time.monotonic() + timeout
        with self._changed:
            while any(self._waiting[n] for n in numbers):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stopped:
                    return False
                self._changed.wait(remaining)
        return True

    def stop(self, timeout: float = 5.0) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify_all()
        self._thread.join(timeout)

    def _next(self) -> tuple[list[list[Any]], list[list[Any]]] | float | None:
        """The releases due now and those to build first (waiting until there are some); None
        once stopped. While sent releases await the broker's confirms, how long to read
        them for instead of waiting here."""
        with self._changed:
            while not self._stopped and not self._fresh:
                wait = (self._heap[0][0] - self._clock()) / 1000 if self._heap else None
                if wait is not None and wait <= 0:
                    break
                if self._in_flight:
                    return CONFIRM_SLICE if wait is None else min(wait, CONFIRM_SLICE)
                self._changed.wait(wait)
            if self._stopped:
                return None
            now = self._clock()
            due: list[list[Any]] = []
            while self._heap and self._heap[0][0] <= now and len(due) < self._batch:
                due.append(heapq.heappop(self._heap))
            fresh, self._fresh = self._fresh[:PREPARE_CHUNK], self._fresh[PREPARE_CHUNK:]
            return due, fresh

    def _serve(self) -> None:
        while (work := self._next()) is not None:
            if isinstance(work, float):
                self._collect(work)
                continue
            due, fresh = work
            if due:
                self._in_flight.append(self._send(due))
                self._report_settled()
            if fresh:
                self._prepare(fresh)
        deadline = time.monotonic() + STOP_CONFIRMS_SECONDS
        while self._in_flight and time.monotonic() < deadline:
            self._collect(CONFIRM_SLICE)
        self._give_up("the dispatcher stopped before the broker confirmed the release")
        self._report_settled()

    def _give_up(self, why: str) -> None:
        """Settle every release still awaiting its confirm as uncertain (none will be read)."""
        for _, results, _ in self._in_flight:
            for result in results:
                if isinstance(result, Unconfirmed) and not result.done:
                    result.settle(ReleaseUncertainError(why))

    def _collect(self, timeout: float) -> None:
        """Read the broker's confirms for up to *timeout* seconds; report what they settled."""
        if self._confirm is None:  # nothing would ever settle them
            self._give_up("no way to read the broker's confirms")
        else:
            try:
                self._confirm(timeout)
            except Exception:  # the publisher settles what it cannot confirm; read again
                logger.warning("reading the broker's confirms failed", exc_info=True)
                time.sleep(timeout)
        self._report_settled()

    def _report_settled(self) -> None:
        """Report the hand-overs whose releases are all settled, oldest first, up to the
        first that is not."""
        while self._in_flight:
            due, results, sent_ms = self._in_flight[0]
            if any(isinstance(r, Unconfirmed) and not r.done for r in results):
                return
            self._in_flight.popleft()
            settled = [r.result if isinstance(r, Unconfirmed) else r for r in results]
            try:
                self._report(Sent([(entry[2], error) for entry, error in zip(due, settled, strict=True)],
                                  sent_ms))
            finally:
                with self._changed:
                    self._waiting.subtract(entry[2].task.partition for entry in due)
                    self._changed.notify_all()

    def _prepare(self, entries: list[list[Any]]) -> None:
        """Build the messages of *entries* not due yet (those due go as they are)."""
        assert self._prepare_many is not None
        now = self._clock()
        ahead = [entry for entry in entries if entry[0] > now]
        if not ahead:
            return
        try:
            built = self._prepare_many([(entry[2].task, entry[2].release) for entry in ahead])
        except Exception:  # built when sent instead
            logger.warning("building %d release message(s) ahead failed", len(ahead), exc_info=True)
            return
        for entry, message in zip(ahead, built, strict=True):
            entry[3] = message

    def _send(self, due: list[list[Any]]) -> InFlight:
        results: dict[int, Exception | Unconfirmed | None] = {}
        certain: list[int] = []
        for index, entry in enumerate(due):
            partition = entry[2].task.partition
            if self._lease_certain(partition):
                certain.append(index)
            else:
                results[index] = ReleaseNotSentError(
                    f"the lease of partition {partition} was not certain when it was to be sent")
        if certain:
            items = [(due[i][2].task, due[i][2].release) for i in certain]
            sent: list[Exception | Unconfirmed | None]
            try:
                if self._publish_prepared is not None:
                    sent = self._publish_prepared(items, [due[i][3] for i in certain])
                else:
                    sent = list(self._publish_many(items))
            except Exception as exc:  # reported: the engine decides
                # whether the broker took them is not known: they stay released, and their
                # outcomes or the end of their leases decide, as for any uncertain send
                logger.warning("sending %d release(s) failed: %s", len(certain), exc, exc_info=True)
                sent = [exc] * len(certain)
            for index, error in zip(certain, sent, strict=True):
                results[index] = error
        return due, [results[index] for index in range(len(due))], self._clock()
