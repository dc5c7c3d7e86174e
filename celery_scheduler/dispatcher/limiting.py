"""The operators' rate limits in a dispatcher's engine: the limiter (:mod:`limits`) kept to
the limits last read (:mod:`pausing`) and to this dispatcher's share of the partitions."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from celery_scheduler.dispatcher.pausing import PauseWatch
from celery_scheduler.dispatcher.state import Partition
from celery_scheduler.dispatcher.timetable import Timetable
from celery_scheduler.metrics import Metrics
from celery_scheduler.store.records import PauseScope

__all__ = ["LimitWatch"]

# its lines are the engine's, as they were before this module was split from it
logger = logging.getLogger("celery_scheduler.dispatcher.engine")


class LimitWatch:
    """Keeps the timetable's limiter to the rate limits the pauses last read and to this
    dispatcher's share of the partitions (it holds *partitions*' leases, of
    :attr:`partition_count`; 0: unknown, the whole limit), and reports them as gauges."""

    def __init__(self, pauses: PauseWatch, timetable: Timetable,
                 partitions: Mapping[int, Partition], metrics: Metrics) -> None:
        self.pauses = pauses
        self.timetable = timetable
        self.partitions = partitions
        self.metrics = metrics
        self.partition_count = 0
        self._seen: tuple[int, float] = (0, 1.0)  # which limits, and which share, it has

    def apply(self) -> None:
        """Give the limiter the limits last read and the share held, when either changed."""
        held = sum(1 for p in self.partitions.values() if p.lease is not None)
        share = held / self.partition_count if self.partition_count else 1.0
        seen = (self.pauses.limits_read, share)
        if seen != self._seen:
            self._seen = seen
            self.timetable.limit_by(self.pauses.limits, share)
            if self.timetable.limiter:
                logger.info("rate limits here: %s", self.timetable.limiter.describe())

    def report(self) -> None:
        if self.pauses.limits or self.timetable.limiter.delayed:  # (once lifted: gauges go)
            limiter = self.timetable.limiter
            self.metrics.rate_limits({r.value: limiter.rate_of(r.value) or 0.0
                                      for r in self.pauses.limits if r.scope is PauseScope.TASK},
                                     limiter.delayed)
