"""Rate limits against the real Kafka, Cassandra, three dispatchers and two workers: a task
name capped at 50 releases a second runs at 50 ± 5 a second at the workers, across the
three dispatchers, each task once and in order per ordering id; lifted, the rest go at once."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.dispatch_fixtures import Scheduler
from tests.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.cassandra, pytest.mark.redis, pytest.mark.serial]
UTC = dt.timezone.utc
TASKS, IDS, RATE = 900, 300, 50


def test_a_task_name_capped_at_50_a_second_runs_at_50_across_three_dispatchers(
        scheduler: Scheduler, schedule: Callable[..., Any]) -> None:
    dispatchers = [scheduler.dispatcher() for _ in range(3)]
    for _ in range(2):
        scheduler.worker()
    ready = scheduler.cli("ready", "--wait", "90")
    assert ready.returncode == 0 and "by 3 dispatcher(s)" in ready.stdout, ready.stdout + ready.stderr
    limited = scheduler.cli("rate-limit", "--task", schedule.record.name, "--per-second", str(RATE))
    assert limited.returncode == 0, limited.stderr
    for process in dispatchers:  # every dispatcher reads the limits every 2 s, and says so
        scheduler.wait_for_log(process, "rate limits here: task", timeout=20)
    due = dt.datetime.now(UTC) + dt.timedelta(seconds=4)
    schedule.record.schedule_many([(due, (f"r{n % IDS:03d}", n // IDS)) for n in range(TASKS)])
    wait_until(lambda: len(scheduler.starts()) >= TASKS * 2 // 3, 60,
               lambda: f"{len(scheduler.starts())} started")
    starts = sorted(s["t"] for s in scheduler.starts())
    # the middle of the run, away from its first and last seconds: 50 ± 5 a second
    first = starts[0]
    window = [t for t in starts if first + 2 <= t < first + 12]
    print(f"{len(window) / 10:.1f} starts a second at the workers under a limit of {RATE}/s")
    assert RATE - 5 <= len(window) / 10 <= RATE + 5, (len(window) / 10, starts[:5])
    # lifted: what still waits goes at once
    lifted = scheduler.cli("rate-limit", "--task", schedule.record.name, "--lift")
    assert lifted.returncode == 0, lifted.stderr
    lifted_at = time.time()
    scheduler.wait_for_starts(TASKS, timeout=60)
    assert max(s["t"] for s in scheduler.starts()) < lifted_at + 8
    runs = scheduler.starts()
    assert len({(s["o"], s["seq"]) for s in runs}) == TASKS == len(runs)
    by_id: dict[str, list[int]] = {}
    for s in sorted(runs, key=lambda s: s["t"]):
        by_id.setdefault(s["o"], []).append(s["seq"])
    assert all(seqs == sorted(seqs) for seqs in by_id.values())
