"""The benchmarks' load generator: a publisher whose calls wait for a round trip keeps up
with the load when several threads publish, and falls behind with one."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from benchmarks.context import feed

RATE, SECONDS, LEAD = 1000.0, 0.4, 0.05
ROUND_TRIP = 0.003  # a publish that waits this long: 3 ms, so one thread holds ~330/s


def _publisher() -> tuple[list[tuple[int, float, float]], Callable[[int, float], None]]:
    calls: list[tuple[int, float, float]] = []  # (i, due, published at)
    lock = threading.Lock()

    def publish(i: int, due: float) -> None:
        time.sleep(ROUND_TRIP)
        with lock:
            calls.append((i, due, time.time()))

    return calls, publish


def test_several_threads_publish_every_task_before_it_is_due() -> None:
    calls, publish = _publisher()
    _, published, planned = feed(publish, RATE, SECONDS, LEAD, threads=8)
    assert published == planned == len(calls) == int(RATE * SECONDS)
    assert sorted(i for i, _, _ in calls) == list(range(planned))  # each once
    late = sum(1 for _, due, at in calls if at > due)
    assert late <= planned // 100, late


def test_one_thread_falls_behind_and_says_how_many_it_published() -> None:
    calls, publish = _publisher()
    _, published, planned = feed(publish, RATE, SECONDS, LEAD)
    assert published == len(calls) < planned
    assert sum(1 for _, due, at in calls if at > due) > planned // 4  # behind, as measured


def test_a_publish_that_raises_stops_the_feed_with_its_error() -> None:
    def publish(i: int, due: float) -> None:
        if i == 5:
            raise ConnectionError("broker away")

    with pytest.raises(ConnectionError, match="broker away"):
        feed(publish, RATE, SECONDS, LEAD, threads=4)
