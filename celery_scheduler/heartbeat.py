"""Beats: how a dispatcher tells a running task from one that never started or whose worker died.

A released task has two leases. Its **start lease** ends ``scheduler_start_lease_seconds``
after its due time (``Release.lease_until_ms``): a copy that starts later is stale and skipped
(``worker``). Once it runs, its **run lease** (``scheduler_lease_seconds``, carried in the
release as ``run_lease_ms``) is renewed by *beats*, records the worker produces to the
outcomes topic beside the outcomes: the first once the task has run :func:`start_after_ms`
(a short task says nothing until its outcome), then one every :func:`beat_every_ms`.

Both sides keep these rules, and together they make releasing again safe without waiting
for long leases:

- A beat *counts* for the worker only if Kafka acknowledged it within :func:`credit_ms` of
  its send (Kafka has it by then, so a dispatcher that has read everything produced up to
  that time has read it), and before the task had to stop. The worker may go on running
  the task until :data:`run lease <RunLease>` after the send of its latest beat that
  counted, and before the first counts, until a dispatcher could take the release for one
  that never started (below), less the clocks' margin: the end of its start lease plus 1 s
  at the defaults, and never less than ``start_after + credit`` after the start. Past that
  it stops the task: it kills the process that runs it (``worker``), because a dispatcher
  may be about to release it again. That happens only while the worker cannot reach Kafka.
- A dispatcher releases a task again only once its outcome reader has read everything
  produced up to the time it judges by (``outcomes_read_until``): for a release of which no
  beat was read, the end of its start lease plus the longest wait for a first beat and the
  credit time, 3 s (the task never started, or
  finished without its outcome reaching Kafka: the new release has a new generation, so a
  late outcome of the old one is not taken for it); for one that beat, the last beat's time
  plus the run lease plus the credit time (its worker has stopped it by then, or is dead).
- Clocks of different machines may differ by up to :data:`CLOCK_MARGIN_MS`: a copy is stale
  that much before its start lease ends, and a beat counts as heard no later than its send
  time plus that margin.

A dispatcher commits its outcome offsets no further than the latest beat of any task it
still sees running, so the next owner of the partition reads that beat again.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from celery_scheduler.clock import now_ms
from celery_scheduler.wire import Beat, Release

__all__ = ["CLOCK_MARGIN_MS", "MAX_CREDIT_MS", "MAX_START_AFTER_MS", "Beats", "RunLease",
           "beat_every_ms", "credit_ms", "heard_ms",
           "not_started_by_ms", "start_after_ms", "stopped_by_ms"]

logger = logging.getLogger(__name__)

# How far the clocks of a worker and a dispatcher may differ (ms).
CLOCK_MARGIN_MS = 2_000
# The longest a beat may take to be acknowledged and still count (ms).
MAX_CREDIT_MS = 2_500
# The longest a task runs before its first beat (ms).
MAX_START_AFTER_MS = 500


def beat_every_ms(run_lease_ms: int) -> int:
    """How often a running task beats: ten beats a run lease."""
    return max(100, run_lease_ms // 10)


def credit_ms(run_lease_ms: int) -> int:
    """How soon Kafka must acknowledge a beat for it to count (at most :data:`MAX_CREDIT_MS`)."""
    return max(100, min(MAX_CREDIT_MS, run_lease_ms // 8))


def start_after_ms(run_lease_ms: int) -> int:
    """How long a task runs before its first beat: shorter tasks send only their outcome."""
    return max(50, min(MAX_START_AFTER_MS, credit_ms(run_lease_ms) // 4))


def not_started_by_ms(lease_until_ms: int) -> int:
    """When a release of which no beat came may be taken never to have run past its start.

    A copy may start up to the clock margin after its start lease's end by the dispatcher's
    clock (a worker's clock that runs that much behind), and is heard of within its first
    beat's wait and credit time after it started, or stopped: whatever its run lease, no
    longer than :data:`MAX_START_AFTER_MS` and :data:`MAX_CREDIT_MS`.
    """
    return lease_until_ms + MAX_START_AFTER_MS + MAX_CREDIT_MS


def stopped_by_ms(heard: int, run_lease_ms: int) -> int:
    """When a task last heard at *heard* is certainly no longer running."""
    return heard + run_lease_ms + credit_ms(run_lease_ms)


def heard_ms(beat: Beat, now: int) -> int:
    """The time a dispatcher counts *beat* as heard at: when it read it, or its send time
    plus the clock margin if that is earlier (a beat read again by a new owner)."""
    return min(now, beat.sent_ms + CLOCK_MARGIN_MS)


@dataclass
class RunLease:
    """One running task's lease, as its worker keeps it (times: the worker's monotonic ms)."""

    release: Release
    started_ms: int  # wall clock, reported in the beats
    alive_until: float  # the task may run until then
    next_beat: float
    beats: int = 0

    @classmethod
    def begin(cls, release: Release, now: float, started_ms: int) -> RunLease:
        """The lease of a task of *release* that starts at *now* (monotonic ms), *started_ms*
        by the wall clock. Until a beat counts, it may run until a dispatcher could take its
        release for one that never started (:func:`not_started_by_ms`, less the clocks'
        margin): a task that started at its due time rides out a Kafka leader's failover of
        several seconds before its first beat. At the least, its first beat's wait and credit
        time (a release without a start lease, or one that started at its end)."""
        first = now + start_after_ms(release.run_lease_ms)
        alive = first + credit_ms(release.run_lease_ms)
        if release.lease_until_ms:
            unheard_until = not_started_by_ms(release.lease_until_ms) - CLOCK_MARGIN_MS
            alive = max(alive, now + unheard_until - started_ms)
        return cls(release, started_ms, alive, first)

    def beat(self, now: float, wall_ms: int) -> Beat:
        """The beat to send now; the next one is due a beat interval later."""
        self.next_beat = now + beat_every_ms(self.release.run_lease_ms)
        self.beats += 1
        r = self.release
        return Beat(r.key, r.partition, r.attempt, r.lease_until_ms, wall_ms, self.started_ms,
                    r.run_lease_ms)

    def acknowledged(self, sent: float, acked: float) -> None:
        """Kafka took the beat sent at *sent* at *acked*: it counts if in time, and while the
        task may still run."""
        if acked - sent <= credit_ms(self.release.run_lease_ms) and acked <= self.alive_until:
            self.alive_until = max(self.alive_until, sent + self.release.run_lease_ms)

    def expired(self, now: float) -> bool:
        return now > self.alive_until

    def wake_at(self) -> float:
        return min(self.next_beat, self.alive_until)


def kill_this_process(lease: RunLease) -> None:
    """Stop the task the only way Python can: end the process that runs it. In a prefork
    pool that is the pool process (Celery starts another); in a solo or threads pool, the
    worker."""
    os.kill(os.getpid(), signal.SIGKILL)


Send = Callable[[Beat, Callable[[bool], None]], None]


@dataclass
class Beats:
    """The running tasks of one process and the thread that beats for them.

    *send* hands a beat to Kafka and calls its argument with whether Kafka took it (from
    *poll*, which serves the client's reports); *fence* stops a task whose lease ran out.
    """

    send: Send
    poll: Callable[[], None]
    fence: Callable[[RunLease], None] = kill_this_process
    clock: Callable[[], float] = field(default=lambda: time.monotonic() * 1000)
    wall: Callable[[], int] = now_ms
    # how often the client's reports are served while a beat is unanswered (ms)
    poll_every_ms: float = 50.0

    def __post_init__(self) -> None:
        self._lock = threading.Condition()
        self._running: dict[int, RunLease] = {}
        self._unanswered = 0
        self._ids = iter(range(1, 2**62))
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def running(self, release: Release, started_ms: int) -> int:
        """A task of *release* starts; returns the token :meth:`done` takes."""
        with self._lock:
            token = next(self._ids)
            self._running[token] = RunLease.begin(release, self.clock(), started_ms)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="celery-scheduler-beats")
                self._thread.start()
            self._lock.notify()
            return token

    def done(self, token: int) -> None:
        with self._lock:
            self._running.pop(token, None)

    def leases(self) -> list[RunLease]:
        with self._lock:
            return list(self._running.values())

    def tick(self) -> float:
        """Send the beats due, stop what expired; return how long to wait (ms, inf: idle)."""
        expired: list[RunLease] = []
        sending: list[tuple[RunLease, Beat, float]] = []
        with self._lock:
            now = self.clock()
            for token, lease in list(self._running.items()):
                if lease.expired(now):
                    expired.append(lease)
                    del self._running[token]
                elif now >= lease.next_beat:
                    sending.append((lease, lease.beat(now, self.wall()), now))
            self._unanswered += len(sending)
        for lease, beat, sent in sending:
            try:
                self.send(beat, self._answer(lease, sent))
            except Exception:  # counts as not taken: the lease runs out if none is
                logger.warning("could not hand a beat of %s to Kafka", beat.key, exc_info=True)
                with self._lock:
                    self._unanswered -= 1
        if self._unanswered:
            self.poll()
        for lease in expired:
            self._fence(lease)
        with self._lock:
            if not self._running:
                return float("inf")
            wait = min(lease.wake_at() for lease in self._running.values()) - self.clock()
            if self._unanswered:
                wait = min(wait, self.poll_every_ms)
            return max(0.0, wait)

    def _answer(self, lease: RunLease, sent: float) -> Callable[[bool], None]:
        def answered(taken: bool) -> None:
            with self._lock:
                self._unanswered -= 1
                if taken:
                    lease.acknowledged(sent, self.clock())
        return answered

    def _fence(self, lease: RunLease) -> None:
        r = lease.release
        logger.critical(
            "%s (attempt %d) has had no beat reach Kafka for its run lease (%.1fs): a dispatcher "
            "may release it again, so it is stopped here (its process is killed)",
            r.key, r.attempt, r.run_lease_ms / 1000)
        self.fence(lease)

    def _run(self) -> None:
        while True:
            wait = self.tick()
            with self._lock:
                if wait > 0:
                    self._lock.wait(None if wait == float("inf") else wait / 1000)
