"""A beat_schedule entry fired by real dispatchers: every occurrence runs, on time, and a
dispatcher SIGKILLed mid-run makes the other go on from where it stopped, neither firing an
occurrence under another key nor skipping one."""

from __future__ import annotations

import datetime as dt
import json
import re
import signal
import time
from typing import Any

import pytest

from celery_scheduler.keys import TaskKey
from tests.integration.dispatch_fixtures import Scheduler, schedule, scheduler  # noqa: F401
from tests.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.cassandra, pytest.mark.redis]

TICK = 2  # seconds between two occurrences


def occurrence_ids(since: float, until: float) -> dict[str, int]:
    """The task ids of the entry's occurrences in (since, until], by the occurrence (ms)."""
    first = (int(since * 1000) // (TICK * 1000) + 1) * TICK * 1000
    ids = {}
    for at in range(first, int(until * 1000) + 1, TICK * 1000):
        iso = dt.datetime.fromtimestamp(at / 1000, dt.timezone.utc).isoformat(timespec="milliseconds")
        ids[TaskKey("periodic:tick", at, iso).task_id] = at
    return ids


def test_each_occurrence_runs_once_on_time_and_a_killed_dispatcher_skips_none(
        scheduler: Scheduler) -> None:  # noqa: F811
    scheduler.env["CELERY_SCHEDULER_TEST_PERIODIC"] = str(TICK)
    first = scheduler.dispatcher()
    second = scheduler.dispatcher()
    scheduler.worker()
    owner = wait_until(lambda: next((p for p in (first, second)
                                     if "firing 1 periodic entry" in scheduler.log_of(p)
                                     and "fired periodic entry" in scheduler.log_of(p)), None),
                       30, "a dispatcher firing the entry")
    assert owner is not None
    survivor = second if owner is first else first
    wait_until(lambda: len(scheduler.starts()) >= 4, 30, "four occurrences run")
    settled_at = time.time()  # the group's first rebalances are over: runs are on time
    fired_before = scheduler.log_of(survivor).count("fired periodic entry")
    killed_at = time.time()
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    # the other dispatcher takes the partition over and fires from where the first stopped
    # (it may have fired the entry already, while the group was forming)
    wait_until(lambda: scheduler.log_of(survivor).count("fired periodic entry") > fired_before, 60,
               lambda: f"the other dispatcher firing the entry:\n{scheduler.log_of(survivor)[-3000:]}")
    taken_at = time.time()

    def ticks() -> list[dict[str, Any]]:
        return [s for s in scheduler.starts() if s["o"] == "periodic:tick"]

    wait_until(lambda: sum(s["t"] > taken_at + TICK for s in ticks()) >= 3, 30,
               "three occurrences run after the takeover")
    starts = ticks()
    until = max(s["t"] for s in starts) - 1.0  # what fell due by then has run, at most 1 s late
    since = min(s["t"] for s in starts) - TICK  # the entry's first occurrence run
    expected = occurrence_ids(since, until)
    ran = {s["task_id"] for s in starts}
    missing = sorted(at for task_id, at in expected.items() if task_id not in ran)
    assert missing == [], [dt.datetime.fromtimestamp(at / 1000).isoformat() for at in missing]
    # every run is an occurrence's key, none made up (the first may have run late, before since)
    strays = ran - set(occurrence_ids(since - 600, time.time() + TICK))
    assert strays == set(), [s for s in starts if s["task_id"] in strays]
    # away from the start and the kill: the group forming, then the partition's takeover
    # (session timeout and lease), delay those due until the other dispatcher fired
    quiet = {task_id: at / 1000 for task_id, at in expected.items()
             if settled_at <= at / 1000 < killed_at - TICK or at / 1000 > taken_at + TICK}
    late = sorted(s["t"] - quiet[s["task_id"]] for s in starts if s["task_id"] in quiet)
    print(f"{len(expected)} occurrences from {since:.0f} to {until:.0f}, {len(starts)} runs; away "
          f"from the kill, lateness median {late[len(late) // 2]:.3f}s, max {late[-1]:.3f}s")
    assert late[-1] < 1.0


def test_a_pause_withdraws_the_occurrences_written_ahead(
        scheduler: Scheduler, schedule: Any) -> None:  # noqa: F811
    """With occurrences written scheduler_periodic_ahead_seconds (30 s) ahead, a pause read by
    the dispatcher cancels them in the schedule: none runs after it, though each is there."""
    scheduler.env["CELERY_SCHEDULER_TEST_PERIODIC"] = str(TICK)
    dispatcher = scheduler.dispatcher()
    scheduler.worker()

    def ticks() -> list[dict[str, Any]]:
        return [s for s in scheduler.starts() if s["o"] == "periodic:tick"]

    wait_until(lambda: len(ticks()) >= 2, 30, "two occurrences run")
    paused = scheduler.cli("periodic", "pause", "tick")
    assert paused.returncode == 0, paused.stderr
    said = wait_until(lambda: re.search(
        r"periodic entry 'tick' paused or deleted: of its occurrences written ahead, (\d+) "
        r"cancelled", scheduler.log_of(dispatcher)), 30, lambda: scheduler.log_of(dispatcher)[-3000:])
    read_at = time.time()
    # 30 s ahead at one every 2 s: about 15 written ahead, all withdrawn
    assert int(said[1]) >= 10, said[0]
    # one released before the pause was read may still start; nothing later does. A key of
    # the entry's ordering id due a few ticks on runs only after every occurrence before it:
    # once it ran, any occurrence released by mistake would have run first.
    barrier_at = read_at + 3 * TICK
    schedule.record.schedule_at(dt.datetime.fromtimestamp(barrier_at, dt.timezone.utc),
                                "periodic:tick", 1, scheduled_for=barrier_at)
    wait_until(lambda: any(s["seq"] == 1 for s in ticks()), 60,
               "a key of the paused entry's ordering id, due after its next occurrences, runs")
    later = [s for s in ticks() if s["t"] > read_at + TICK and s["seq"] == 0]
    assert later == [], later
    entries = scheduler.cli("periodic", "list", "--json")
    assert entries.returncode == 0, entries.stderr
    [entry] = [json.loads(line) for line in entries.stdout.splitlines()]
    assert entry["state"] == "paused", entry
    # what was written ahead is cancelled: every occurrence of the next 20 s (within the 30 s)
    first = (int(read_at * 1000) // (TICK * 1000) + 2) * TICK * 1000
    keys = [TaskKey("periodic:tick", at, dt.datetime.fromtimestamp(at / 1000, dt.timezone.utc)
                    .isoformat(timespec="milliseconds")) for at in range(first, first + 20_000, TICK * 1000)]
    states = [status.state.value if status else None
              for status in schedule.record.client.store.statuses(keys)]
    assert states == ["cancelled"] * len(keys), list(zip(keys, states, strict=True))
