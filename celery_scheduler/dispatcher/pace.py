"""How fast the release engine goes: the flow-control window, and where its time goes."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from celery_scheduler.dispatcher.state import Partition
from celery_scheduler.dispatcher.timetable import Timetable

__all__ = ["BEHIND_SWITCH_INTERVAL", "ON_TIME_SWITCH_INTERVAL", "Switching", "Watch", "Window"]

logger = logging.getLogger("celery_scheduler.dispatcher.engine")  # its lines are the engine's


class Watched(Protocol):
    """What :class:`Watch` reads of the engine it reports on."""

    @property
    def released_count(self) -> int: ...

    @property
    def timetable(self) -> Timetable: ...

    @property
    def partitions(self) -> Mapping[int, Partition]: ...


class Watch:
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

    def step_done(self, engine: Watched) -> None:
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


class Window:
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


# How long (seconds) a thread of the dispatcher may hold the interpreter before another that
# waits takes it. While releases are on time: Python's default, 5 ms, let the ingest loop's
# decoding hold the release engine up to 5 ms after a task fell due, so a dispatcher
# switches ten times as often. While they are late (a backlog): its threads (engine,
# sender, the Cassandra driver's, the outcome reader) all want the interpreter at once, and
# each forced switch costs time none of them uses. Draining 100,000 overdue tasks with
# workers that report at once (``benchmarks.ceiling``), 5 ms released more a second than
# 0.5 ms in six of nine alternated pairs of runs, median +8%.
ON_TIME_SWITCH_INTERVAL = 0.0005
BEHIND_SWITCH_INTERVAL = 0.005


class Switching:
    """Sets the switch interval from how late the engine's releases are.

    A step that releases a task ``BEHIND_MS`` or more after it fell due puts the process
    behind; it is on time again at the first step whose releases are all within
    ``ON_TIME_MS`` of their due time, or that finds nothing due. *set_interval* is
    ``sys.setswitchinterval`` in a dispatcher's process (None: leave it alone).
    """

    BEHIND_MS = 1000
    ON_TIME_MS = 100

    def __init__(self, set_interval: Callable[[float], None] | None = None) -> None:
        self._set = set_interval
        self.behind = False

    def released(self, late_ms: int | None) -> None:
        """A step released tasks, the most overdue *late_ms* after its due time (None: nothing was due)."""
        if late_ms is None:
            behind = False
        elif self.behind:
            behind = late_ms > self.ON_TIME_MS
        else:
            behind = late_ms >= self.BEHIND_MS
        if behind == self.behind:
            return
        self.behind = behind
        interval = BEHIND_SWITCH_INTERVAL if behind else ON_TIME_SWITCH_INTERVAL
        if self._set is not None:
            self._set(interval)
        logger.debug("releases %s: switch interval %.1f ms", "late" if behind else "on time",
                     1000 * interval)
