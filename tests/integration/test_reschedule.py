"""Reschedule in place against the real Kafka, Cassandra, dispatchers and a worker: keys
moved earlier and later (from Python and from the CLI), with the dispatcher that owned them
SIGKILLed right after the moves, each run once at its new time, in order, and never at the
old one; a key released already is refused with the reason."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from celery_scheduler.errors import NotReschedulableError
from tests.integration.dispatch_fixtures import Scheduler
from tests.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.cassandra, pytest.mark.redis]
UTC = dt.timezone.utc


def utc(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, UTC)


def test_moved_keys_run_once_at_their_new_time_through_a_dispatcher_kill(
        scheduler: Scheduler, schedule: Callable[..., Any]) -> None:
    first = scheduler.dispatcher()
    scheduler.worker()
    now = time.time()
    times = [now + 8, now + 10, now + 12]
    handles = [schedule.record.schedule_at(utc(at), "moving", n, scheduled_for=at)
               for n, at in enumerate(times)]
    wait_until(lambda: all(h.status() is not None for h in handles), 30, "the tasks stored")
    # seq 0 later (still before seq 1), from Python with the arguments saying so; seq 2
    # earlier (still after seq 1), from the CLI
    early_to, late_to = now + 9.5, now + 11
    moved = handles[0].reschedule(at=utc(early_to), kwargs={"scheduled_for": early_to})
    assert moved.task_id == handles[0].task_id
    cli = scheduler.cli("reschedule", "moving", handles[2].key.scheduled_at.isoformat(), "seq-2",
                        "--to", utc(late_to).isoformat())
    assert cli.returncode == 0, cli.stderr
    # the dispatcher that applied (or was about to apply) them dies; another takes over
    first.kill()
    first.wait()
    second = scheduler.dispatcher(wait=False)
    # a key of the ordering id due after the last old time runs only after every key before
    # it: once it ran, a run at an old time would have shown
    after = times[2] + 1
    schedule.record.schedule_at(utc(after), "moving", 3, scheduled_for=after)
    scheduler.wait_for_starts(4, timeout=90, what="the three tasks and the one after them")
    runs = [(s["seq"], s["scheduled_for"], s["t"]) for s in scheduler.starts()]
    assert [seq for seq, _, _ in runs] == [0, 1, 2, 3], (runs, scheduler.log_of(second)[-3000:])
    # seq 0 ran at its new time with its new arguments, seq 2 at its new time with its old ones
    assert runs[0][1] == early_to and runs[0][2] >= early_to
    assert runs[2][1] == times[2] and runs[2][2] >= late_to and runs[2][2] < times[2]
    for handle, state in ((handles[0], "rescheduled"), (handles[2], "rescheduled"),
                          (moved, "succeeded")):
        wait_until(lambda h=handle, s=state: (h.status() is not None and h.status().state.value == s),
                   15, lambda h=handle: f"{h.key}: {h.status()}")
    shown = json.loads(scheduler.cli("inspect", "moving", handles[2].key.scheduled_at.isoformat(),
                                     "seq-2", "--json").stdout)
    assert shown["state"] == "rescheduled" and shown["moved_to"].startswith("moving@")
    assert any("reschedule" in line for line in shown["operator_actions"])


def test_a_released_key_is_refused_and_runs_at_its_time(
        scheduler: Scheduler, schedule: Callable[..., Any]) -> None:
    scheduler.dispatcher()
    scheduler.worker()
    now = time.time()
    handle = schedule.record.schedule_at(utc(now + 2), "ran", 0, scheduled_for=now + 2)
    scheduler.wait_for_starts(1, timeout=60)
    with pytest.raises(NotReschedulableError, match=r"released to the workers already|succeeded already"):
        handle.reschedule(countdown=30)
    refused = scheduler.cli("reschedule", "ran", handle.key.scheduled_at.isoformat(), "seq-0",
                            "--in", "30")
    assert refused.returncode == 1 and "cannot reschedule" in refused.stderr + refused.stdout
