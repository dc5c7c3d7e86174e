"""Pauses against the real Kafka, Cassandra, dispatchers and a worker: an ordering id paused
from the CLI is held through a rebalance and a dispatcher's SIGKILL while another ordering
id's tasks run, and once resumed its tasks run, in order."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.dispatch_fixtures import Scheduler
from tests.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.cassandra, pytest.mark.redis]
UTC = dt.timezone.utc
HELD = 5


def utc(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, UTC)


def started(scheduler: Scheduler, ordering_id: str) -> list[int]:
    return [s["seq"] for s in scheduler.starts() if s["o"] == ordering_id]


def test_a_paused_ordering_id_is_held_through_a_rebalance_and_a_kill_then_resumed_in_order(
        scheduler: Scheduler, schedule: Callable[..., Any]) -> None:
    first = scheduler.dispatcher()
    scheduler.worker()
    paused = scheduler.cli("pause", "--ordering-id", "held", "--reason", "incident 7")
    assert paused.returncode == 0, paused.stderr
    listed = json.loads(scheduler.cli("pauses", "--json").stdout)
    assert [(p["scope"], p["value"], p["reason"]) for p in listed] == [
        ("ordering_id", "held", "incident 7")]
    # the dispatcher reads the pauses every 2 s, and says when what they hold changed
    scheduler.wait_for_log(first, "pauses in force: holding 1 ordering id(s)", timeout=15)
    now = time.time()
    for n in range(HELD):
        schedule.record.schedule_at(utc(now + 2 + n * 0.2), "held", n, scheduled_for=now + 2 + n * 0.2)
    schedule.record.schedule_at(utc(now + 2), "free", 0, scheduled_for=now + 2)
    wait_until(lambda: started(scheduler, "free") == [0], 60, scheduler.starts)

    # a second dispatcher takes half the partitions over, then the first is SIGKILLed: the
    # second takes the rest once their leases end, and holds the pause it read from the store
    second = scheduler.dispatcher(wait=False)
    scheduler.wait_for_log(second, "leased partition", timeout=60)
    first.kill()
    first.wait()
    killed_at = time.time()
    schedule.record.schedule_at(utc(killed_at + 1), "free", 1, scheduled_for=killed_at + 1)
    wait_until(lambda: started(scheduler, "free") == [0, 1], 60,
               lambda: scheduler.log_of(second)[-3000:])
    # free 1 fell due after every held task, and the one worker runs tasks in the order they
    # were released: a held task released would have started before it
    assert started(scheduler, "held") == [], "a paused ordering id ran"

    resumed = scheduler.cli("resume", "--ordering-id", "held")
    assert resumed.returncode == 0 and "resumed" in resumed.stdout, resumed.stderr
    wait_until(lambda: len(started(scheduler, "held")) >= HELD, 60, scheduler.starts)
    assert started(scheduler, "held") == list(range(HELD))  # in order, each once
    assert scheduler.cli("pauses").stdout == "nothing is paused\n"
    assert "pauses in force: holding 1 ordering id(s)" in scheduler.log_of(second)


def test_a_dispatcher_started_while_everything_is_paused_releases_nothing_until_resumed(
        scheduler: Scheduler, schedule: Callable[..., Any]) -> None:
    """... and a task whose deadline passed meanwhile expires instead of running late."""
    assert scheduler.cli("pause", "--all").returncode == 0
    scheduler.dispatcher()
    scheduler.worker()
    now = time.time()
    first = schedule.record.schedule_at(utc(now + 1), "any", 0, scheduled_for=now + 1)
    expiring = schedule.record.schedule(("any", 1), {"scheduled_for": now + 1.5},
                                        at=utc(now + 1.5), expires=2)
    last = schedule.record.schedule_at(utc(now + 2), "any", 2, scheduled_for=now + 2)
    # stored, and past due by more than the release-ahead and a read of the pauses (and past
    # the expiring one's deadline): none ran
    wait_until(lambda: all(h.status() is not None for h in (first, expiring, last))
               and time.time() > now + 5, 30, "the tasks stored and past due")
    assert scheduler.starts() == []
    assert scheduler.cli("resume", "--all").returncode == 0
    scheduler.wait_for_starts(2, timeout=30)
    assert [s["seq"] for s in scheduler.starts()] == [0, 2]

    def expired() -> bool:
        status = expiring.status()
        return status is not None and status.state.value == "expired"

    wait_until(expired, 10, lambda: f"{expiring.key} expired: {expiring.status()}")
