"""What every scenario gets: the mode's counts and runs, and a scratch directory."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Context", "feed", "utc"]


@dataclass(frozen=True)
class Context:
    quick: bool
    tmp: Path
    runs: int  # repetitions of the short scenarios

    def pick(self, quick: int | float, full: int | float) -> int:
        return int(quick if self.quick else full)


def utc(epoch: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc)


def feed(publish: Callable[[int, float], None], rate: float, duration: float, lead: float
         ) -> tuple[float, int, int]:
    """Publish task i, due at ``t0 + i / rate``, *lead* seconds before it is due.

    Returns (t0, tasks published, tasks planned). Publishing keeps *lead* seconds ahead of
    the due times for as long as the publisher keeps up, which is what a steady producer of
    scheduled work looks like; a publisher slower than *rate* stops at the last due time,
    leaving the rest unpublished (the caller reports how many).
    """
    total = int(rate * duration)
    t0 = time.time() + lead + 1.0
    end = t0 + duration
    i = 0
    while i < total:
        now = time.time()
        if now > end:
            break
        horizon = now + lead
        while i < total and t0 + i / rate <= horizon:
            publish(i, t0 + i / rate)
            i += 1
            if i % 100 == 0 and time.time() > end:
                break
        time.sleep(0.005)
    return t0, i, total
