"""The one clock: wall-clock time in integer epoch milliseconds (UTC).

Every part that stamps or compares times takes a :data:`Clock` (the system's by default), so
tests and the testing helper move time by hand with a :class:`FakeClock`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["Clock", "FakeClock", "now_ms"]

Clock = Callable[[], int]


def now_ms() -> int:
    """The system's wall-clock time in epoch milliseconds."""
    return time.time_ns() // 1_000_000


class FakeClock:
    """Epoch milliseconds that move only when told to."""

    def __init__(self, start_ms: int) -> None:
        self.ms = start_ms

    def __call__(self) -> int:
        return self.ms
