"""What the operators' pauses hold back, as a dispatcher knows it.

:class:`Held` is pure: the timetable asks it of each ordering id's head before taking it.
:class:`PauseWatch` reads the pauses, and the rate limits (see ``limits``), from the store
every ``READ_EVERY_MS`` (from the engine's thread, between steps). Until its first read it
holds everything: a dispatcher that starts or restarts must not release what an operator
paused. A failed read keeps what
was read last (everything, if nothing was), and is logged once per outage; it never fails
the engine's step, whose lease upkeep must go on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from celery_scheduler.errors import SchedulerError
from celery_scheduler.outages import Outages
from celery_scheduler.store.records import Pause, PauseScope, RateLimit

__all__ = ["EVERYTHING", "NOTHING", "READ_EVERY_MS", "Held", "Levers", "PauseWatch"]

logger = logging.getLogger("celery_scheduler.dispatcher.engine")  # its lines are the engine's

READ_EVERY_MS = 2000  # how often a dispatcher reads the pauses


@dataclass(frozen=True)
class Held:
    """What the pauses in force hold back."""

    everything: bool = False
    tasks: frozenset[str] = frozenset()
    ordering_ids: frozenset[str] = frozenset()

    @classmethod
    def of(cls, pauses: Iterable[Pause]) -> Held:
        kept = list(pauses)
        return cls(any(p.scope is PauseScope.ALL for p in kept),
                   frozenset(p.value for p in kept if p.scope is PauseScope.TASK),
                   frozenset(p.value for p in kept if p.scope is PauseScope.ORDERING_ID))

    def holds(self, task: str, ordering_id: str) -> bool:
        return self.everything or task in self.tasks or ordering_id in self.ordering_ids

    def __bool__(self) -> bool:
        return self.everything or bool(self.tasks) or bool(self.ordering_ids)

    def describe(self) -> str:
        if self.everything:
            return "everything"
        parts = [f"{len(names)} {what}" for what, names in (("task name(s)", self.tasks),
                                                            ("ordering id(s)", self.ordering_ids))
                 if names]
        return ", ".join(parts) or "nothing"


NOTHING = Held()
EVERYTHING = Held(everything=True)


class Levers(Protocol):
    """What a :class:`PauseWatch` reads: the pauses and the rate limits (a store's
    ``PauseTable`` and ``RateLimitTable``)."""

    def pauses(self) -> list[Pause]: ...

    def rate_limits(self) -> list[RateLimit]: ...


class PauseWatch:
    """The pauses and rate limits as last read from the store; called from the engine's
    thread only."""

    def __init__(self, store: Levers, every_ms: int = READ_EVERY_MS,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.every_ms = every_ms
        self.held = EVERYTHING  # until read once
        self.limits: list[RateLimit] = []  # as last read; a failed read keeps them
        self.limits_read = 0  # how many times they changed (a new list each time)
        self._read_ms: int | None = None
        self._monotonic = monotonic
        self._outages: Outages[str] = Outages()

    def refresh(self, now_ms: int) -> bool:
        """Read the pauses if it is time to; True if what they hold changed."""
        if self._read_ms is not None and now_ms - self._read_ms < self.every_ms:
            return False
        self._read_ms = now_ms
        try:
            held = Held.of(self.store.pauses())
            limits = sorted(self.store.rate_limits(), key=lambda r: (r.scope.value, r.value))
        except SchedulerError as exc:
            if self._outages.failed("pauses", self._monotonic()):
                logger.warning("could not read the pauses (%s); holding %s, as last read, until "
                               "they can be read", exc, self.held.describe())
            return False
        for ended in self._outages.all_recovered(self._monotonic()) if self._outages else ():
            logger.warning("the pauses are read again: %s", ended.describe("reads failed"))
        if limits != self.limits:
            logger.info("rate limits in force: %s", ", ".join(
                f"{r.label} {r.per_second:g}/s" for r in limits) or "none")
            self.limits = limits
            self.limits_read += 1
        if held == self.held:
            return False
        logger.info("pauses in force: holding %s (was %s)", held.describe(), self.held.describe())
        self.held = held
        return True
