"""What every scenario gets: the mode's counts and runs, and a scratch directory."""

from __future__ import annotations

import datetime as dt
import queue
import threading
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


def feed(publish: Callable[[int, float], None], rate: float, duration: float, lead: float,
         threads: int = 1) -> tuple[float, int, int]:
    """Publish task i, due at ``t0 + i / rate``, *lead* seconds before it is due.

    Returns (t0, tasks published, tasks planned). Publishing keeps *lead*
    seconds ahead of the due times for as long as the publisher keeps up, which is what a
    steady producer of scheduled work looks like; a publisher slower than *rate* stops at the
    last due time, leaving the rest unpublished (the caller reports how many). With *threads*
    above 1, that many threads call *publish* (which must then be thread-safe), so that a
    system whose publish call waits for a round trip is not held to one call at a time.
    """
    total = int(rate * duration)
    t0 = time.time() + lead + 1.0
    end = t0 + duration
    if threads > 1:
        return t0, _feed_threads(publish, rate, total, t0, end, lead, threads), total
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


def _feed_threads(publish: Callable[[int, float], None], rate: float, total: int, t0: float,
                  end: float, lead: float, threads: int) -> int:
    """:func:`feed`'s tasks handed to *threads* publishing threads; how many were published.

    A task taken after the last due time is left unpublished, as one thread leaves it: its
    seq is then never started, and the caller's count of published tasks leaves it out.
    """
    tasks: queue.Queue[tuple[int, float] | None] = queue.Queue()
    errors: list[BaseException] = []
    published = [0] * threads

    def work(n: int) -> None:
        while (task := tasks.get()) is not None:
            if time.time() > end or errors:
                continue
            try:
                publish(*task)
                published[n] += 1
            except BaseException as exc:
                errors.append(exc)

    workers = [threading.Thread(target=work, args=(n,), name=f"publisher-{n}", daemon=True)
               for n in range(threads)]
    for worker in workers:
        worker.start()
    i = 0
    while i < total and time.time() <= end and not errors:
        horizon = time.time() + lead
        while i < total and t0 + i / rate <= horizon:
            tasks.put((i, t0 + i / rate))
            i += 1
        time.sleep(0.005)
    for _ in workers:
        tasks.put(None)
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]
    return sum(published)
