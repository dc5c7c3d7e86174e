"""The drop-in eta mode against the real services: Celery's two known eta failures avoided.

A task written for plain Celery calls ``apply_async(countdown=...)``; with
``DurableEtaTask`` the call goes through the scheduler instead of a worker's memory, so:

- a worker SIGKILLed while the tasks wait (Celery: they come back only after the broker's
  visibility timeout, an hour on Redis) loses nothing, and the tasks run on time;
- an eta beyond the broker's visibility timeout (Celery: Redis hands the waiting message to
  a worker again, and it runs twice) runs once.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import signal
import time
from typing import Any

import pytest
import redis

from celery_scheduler import eta
from celery_scheduler.config import get_settings
from celery_scheduler.partitioner import partition_for
from tests.integration.dispatch_fixtures import Scheduler
from tests.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.cassandra, pytest.mark.redis]

COUNT = 20


def copies_left(scheduler: Scheduler, broker_url: str) -> int:
    """Messages of the test's queue that Redis holds or could hand out again: waiting in the
    queue, or delivered and not yet acknowledged (given back after the visibility timeout)."""
    queue = scheduler.env["CELERY_SCHEDULER_TEST_QUEUE"]
    with redis.Redis.from_url(broker_url) as broker:
        unacked = [json.loads(entry) for entry in broker.hvals("unacked")]
        return int(broker.llen(queue)) + sum(1 for *_, routing_key in unacked if routing_key == queue)


def check_ran_once_on_time(scheduler: Scheduler, results: list[Any], due: float) -> None:
    scheduler.wait_for_starts(COUNT, timeout=90)
    # every run ended, and Redis holds no copy that could run a task a second time
    for result in results:
        result.get(timeout=30)
    wait_until(lambda: copies_left(scheduler, results[0].app.conf.broker_url) == 0, 30,
               "the broker to hold no message of the queue")
    starts = scheduler.starts()
    assert sorted(s["seq"] for s in starts) == list(range(COUNT))  # each once
    for start in starts:
        assert start["t"] >= due - 0.001, "ran before it was due"
        assert start["t"] - due < 5.0, f"ran {start['t'] - due:.1f}s late"


def test_a_worker_killed_while_tasks_wait_loses_none_of_them(
        scheduler: Scheduler, schedule: Any) -> None:
    scheduler.dispatcher()
    worker = scheduler.worker()
    due = time.time() + 8
    results = [schedule.eta_record.apply_async(("eta", n), {"scheduled_for": due}, countdown=8)
               for n in range(COUNT)]
    assert len({r.id for r in results}) == COUNT
    # once the dispatcher stored them all (Celery's own eta tasks would be in the worker's
    # memory by then)
    wait_until(lambda: all(eta.status(schedule.app, r.id) is not None for r in results), 30,
               "the dispatcher storing the tasks")
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=10)
    scheduler.worker()
    check_ran_once_on_time(scheduler, results, due)
    # the runs used the task ids apply_async returned: their results are there
    assert sorted(r.get(timeout=30) for r in results) == list(range(COUNT))


@pytest.fixture
def short_visibility(scheduler: Scheduler) -> Scheduler:
    scheduler.env["CELERY_SCHEDULER_TEST_VISIBILITY_TIMEOUT"] = "2"
    return scheduler


def test_an_eta_beyond_the_visibility_timeout_runs_once(
        short_visibility: Scheduler, schedule: Any) -> None:
    scheduler = short_visibility
    scheduler.dispatcher()
    scheduler.worker()
    scheduler.worker()
    due = time.time() + 10  # five visibility timeouts ahead
    results = [schedule.eta_record.apply_async(("eta", n), {"scheduled_for": due}, countdown=10)
               for n in range(COUNT)]
    check_ran_once_on_time(scheduler, results, due)


def test_a_call_made_again_with_its_task_id_moves_the_task_and_it_runs_once(
        scheduler: Scheduler, schedule: Any) -> None:
    """The same apply_async made again with its task_id and countdown (a retried request: an
    eta a little later) moves the waiting task; once it ran, such a call runs nothing."""
    scheduler.dispatcher()
    scheduler.worker()
    ids = [f"again-{n}" for n in range(COUNT)]
    first_due = time.time() + 6
    for n, task_id in enumerate(ids):
        schedule.eta_record.apply_async(("again", n), {"scheduled_for": first_due}, countdown=6,
                                        task_id=task_id)
    wait_until(lambda: all(eta.status(schedule.app, i) is not None for i in ids), 30,
               "the dispatcher storing the tasks")
    time.sleep(0.5)
    due = time.time() + 6
    results = [schedule.eta_record.apply_async(("again", n), {"scheduled_for": due}, countdown=6,
                                               task_id=task_id) for n, task_id in enumerate(ids)]
    barrier(scheduler, schedule, "first", due + 1)
    starts = [s for s in scheduler.starts() if s["o"] == "again"]
    assert sorted(s["seq"] for s in starts) == list(range(COUNT))  # each once
    assert all(s["scheduled_for"] == due and s["t"] >= due - 0.001 for s in starts)
    assert sorted(r.get(timeout=30) for r in results) == list(range(COUNT))
    # spent: called once more, nothing runs
    schedule.eta_record.apply_async(("again", 0), {"scheduled_for": time.time() + 2}, countdown=2,
                                    task_id=ids[0])
    barrier(scheduler, schedule, "second", time.time() + 3)
    assert len([s for s in scheduler.starts() if s["o"] == "again"]) == COUNT


def barrier(scheduler: Scheduler, schedule: Any, name: str, at: float) -> None:
    """Run one eta-mode task due at *at* in each partition of the topic, and wait until all
    have started. One dispatcher reads each partition in order and releases by due time, and
    one solo worker starts what it is sent in turn: by then, every task of the partitions due
    before *at*, and read before these, has started."""
    partitions = get_settings(schedule.app).kafka_partitions
    ids: dict[int, str] = {}
    for n in itertools.count():
        ids.setdefault(partition_for(f"{name}-{n}", partitions), f"{name}-{n}")
        if len(ids) == partitions:
            break
    when = dt.datetime.fromtimestamp(at, dt.timezone.utc)
    for n, task_id in enumerate(ids.values()):
        schedule.eta_record.apply_async((name, n), {"scheduled_for": at}, eta=when, task_id=task_id)
    wait_until(lambda: sum(s["o"] == name for s in scheduler.starts()) >= partitions,
               max(0.0, at - time.time()) + 60, f"the {name} barrier's tasks run")
