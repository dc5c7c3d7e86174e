"""How fast the release engine goes: the flow-control window, and where its time goes."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from celery_scheduler.dispatcher.engine import Engine

__all__ = ["Watch", "Window"]

logger = logging.getLogger("celery_scheduler.dispatcher.engine")  # its lines are the engine's


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
