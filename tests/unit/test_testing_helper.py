"""The testing helper runs the real ingest loop and engine over memory, on a fake clock."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest

from celery_scheduler.config import get_settings
from celery_scheduler.errors import SchedulerError
from celery_scheduler.store.base import State
from celery_scheduler.testing import SchedulerTesting, scheduler_testing
from tests.unit.apps import app, calls, failures_left, flaky, ignored_runs, ignoring, remind

UTC = dt.timezone.utc
START = dt.datetime(2030, 1, 1, 9, 0, tzinfo=UTC)


@pytest.fixture
def scheduler() -> Iterator[SchedulerTesting]:
    calls.clear()
    failures_left.clear()
    with scheduler_testing(app, start=START) as testing:
        yield testing


def test_a_task_runs_when_its_time_comes_and_never_again(scheduler: SchedulerTesting) -> None:
    handle = remind.schedule_in(3600, "c1", kind="welcome")
    assert scheduler.advance(3599) == []
    status = handle.status()
    assert status is not None and status.state is State.PENDING  # stored by the dispatcher
    [run] = scheduler.advance(1)
    assert run.key == handle.key and run.succeeded and run.result.get() == "c1:welcome"
    assert run.at == START + dt.timedelta(hours=1)
    status = handle.status()
    assert status is not None and status.state is State.SUCCEEDED
    remind.schedule_at(handle.key.scheduled_at, "c1", kind="welcome")  # the same key again
    assert scheduler.advance(dt.timedelta(days=1)) == []
    assert calls == [("c1", "welcome")]
    assert scheduler.pending() == []


def test_tasks_of_one_ordering_id_run_in_order_after_retries(scheduler: SchedulerTesting) -> None:
    failures_left["c1"] = 2  # the first task fails twice, then succeeds
    first = flaky.schedule_in(10, "c1", "first")
    second = flaky.schedule_in(11, "c1", "second")  # due while the first is being retried
    other = flaky.schedule_in(11, "c2", "other")  # another ordering id does not wait
    runs = scheduler.advance(60)
    assert [(r.key, r.attempt, r.succeeded) for r in runs] == [
        (first.key, 1, False), (other.key, 1, True), (first.key, 2, False), (first.key, 3, True),
        (second.key, 1, True)]
    # each retry after its jittered backoff (2 s, then 4 s, each scaled by 0.5 to 1)
    assert dt.timedelta(seconds=1) <= runs[2].at - runs[0].at <= dt.timedelta(seconds=2)
    assert dt.timedelta(seconds=2) <= runs[3].at - runs[2].at <= dt.timedelta(seconds=4)
    assert runs[4].at >= runs[3].at
    status = first.status()
    assert status is not None and status.state is State.SUCCEEDED and status.attempts == 3


def test_a_task_that_keeps_failing_fails_after_its_last_attempt(scheduler: SchedulerTesting) -> None:
    failures_left["c1"] = 10
    handle = flaky.schedule_in(5, "c1", "doomed")
    runs = scheduler.advance(dt.timedelta(minutes=5))
    assert [(r.attempt, r.succeeded) for r in runs] == [(1, False), (2, False), (3, False)]
    status = handle.status()
    assert status is not None and status.state is State.FAILED
    assert status.last_error == "RuntimeError: c1 is not ready"


def test_a_cancelled_task_does_not_run(scheduler: SchedulerTesting) -> None:
    kept = remind.schedule_in(60, "c1", kind="kept")
    dropped = remind.schedule_in(60, "c1", kind="dropped")
    scheduler.advance(30)
    dropped.cancel()
    assert [r.key for r in scheduler.advance(60)] == [kept.key]
    status = dropped.status()
    assert status is not None and status.state is State.CANCELLED
    assert scheduler.cancelled() == [dropped.key]


def test_delays_count_from_the_fake_clock(scheduler: SchedulerTesting) -> None:
    scheduler.advance(dt.timedelta(days=30))
    handle = remind.schedule_in(60, "c1")
    assert handle.key.scheduled_at == START + dt.timedelta(days=30, seconds=60)
    assert scheduler.now == START + dt.timedelta(days=30)
    [run] = scheduler.advance(60)
    assert run.key == handle.key


def test_a_task_further_than_the_lookahead_runs_on_time(scheduler: SchedulerTesting) -> None:
    handle = remind.schedule_in(dt.timedelta(days=400), "c1")
    [run] = scheduler.advance(dt.timedelta(days=500))
    assert run.at == handle.key.scheduled_at


def test_run_due_and_advance_do_not_run_a_task_twice(scheduler: SchedulerTesting) -> None:
    remind.schedule_in(60, "c1")
    assert len(scheduler.run_due()) == 1
    assert scheduler.advance(120) == []
    assert calls == [("c1", "default")]


@pytest.mark.parametrize("by", [-1, float("nan"), float("inf"), "10", True])
def test_advance_refuses_what_is_not_a_time_forward(scheduler: SchedulerTesting, by: object) -> None:
    with pytest.raises(SchedulerError, match="advance"):
        scheduler.advance(by)  # type: ignore[arg-type]


def test_the_start_must_be_aware() -> None:
    with pytest.raises(SchedulerError, match="aware"), scheduler_testing(app, start=dt.datetime(2030, 1, 1)):
        pass


def test_a_task_that_raises_ignore_counts_as_a_failed_attempt_like_on_a_worker(
        scheduler: SchedulerTesting) -> None:
    ignored_runs.clear()
    ignoring.schedule_in(10, "c1")
    remind.schedule_in(20, "c1")  # the same ordering id: it waits behind the first
    [first] = scheduler.advance(10)
    assert first.attempt == 1 and ignored_runs == ["c1"]
    runs = scheduler.advance(get_settings(app).retry_backoff)  # retried after its backoff
    assert [(r.key.ordering_id, r.attempt) for r in runs] == [("c1", 2)]
    assert calls == []  # the next task of c1 still waits
    status = scheduler.store.status(first.key)
    assert status is not None and status.last_error == "the task raised Ignore"


def test_a_hundred_tasks_of_one_ordering_id_scheduled_at_once_all_run_in_order(
        scheduler: SchedulerTesting) -> None:
    """More than a batch writes of one ordering id at a time (its rounds): the rest is
    carried to the next batches, and the helper writes those too before it releases."""
    handles = [remind.schedule_in(60 + n, "c1", kind=f"k{n:03}") for n in range(100)]
    runs = scheduler.advance(3600)
    assert [run.key for run in runs] == [handle.key for handle in handles]
    assert scheduler.pending() == []
