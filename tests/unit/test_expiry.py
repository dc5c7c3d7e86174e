"""Expiry: ``expires=`` is a deadline after the scheduled time; a task the dispatchers could
not release by then is marked expired instead of run late, and its ordering id moves on."""

from __future__ import annotations

import datetime as dt

import pytest
from prometheus_client import CollectorRegistry

from celery_scheduler import pauses
from celery_scheduler.calls import deadline_ms, expiry_options
from celery_scheduler.clock import FakeClock
from celery_scheduler.dispatcher.engine import Engine, EngineSettings
from celery_scheduler.envelope import ScheduleEnvelope
from celery_scheduler.errors import NotRetryableError, ScheduleTimeError
from celery_scheduler.keys import TaskKey
from celery_scheduler.metrics import PrometheusMetrics
from celery_scheduler.store.memory import MemoryScheduleStore
from celery_scheduler.store.records import Pause, PauseScope, State
from celery_scheduler.testing import SchedulerTesting
from tests.unit.apps import app, remind
from tests.unit.conftest import START
from tests.unit.fakes import NOW

UTC = dt.timezone.utc
AT = 1_893_456_000_000  # 2030-01-01T00:00:00Z


def test_expires_is_kept_as_seconds_after_the_scheduled_time() -> None:
    at = dt.datetime(2030, 1, 1, tzinfo=UTC)
    assert expiry_options({"expires": 30}, None, AT) == {"expires": 30}
    assert expiry_options({"expires": dt.timedelta(minutes=2)}, None, AT) == {"expires": 120.0}
    assert expiry_options({"expires": at + dt.timedelta(seconds=90)}, None, AT) == {"expires": 90.0}
    # a naive time is in the app's zone, as at= is
    plus_one = dt.timezone(dt.timedelta(hours=1))
    assert expiry_options({"expires": dt.datetime(2030, 1, 1, 1, 1)}, None, AT, plus_one) == {
        "expires": 60.0}
    assert expiry_options({"queue": "q"}, 600, AT) == {"queue": "q", "expires": 600}  # the task's
    assert expiry_options({"expires": 5}, 600, AT) == {"expires": 5}  # the call's wins
    assert expiry_options(None, None, AT) is None
    assert deadline_ms(AT, {"expires": 1.5}) == AT + 1500
    assert deadline_ms(AT, {"queue": "q"}) is None


def test_an_expiry_before_the_scheduled_time_or_negative_is_refused() -> None:
    with pytest.raises(ScheduleTimeError, match=r"expires=2029-12-31T23:59:00\+00:00 is 60s before"):
        expiry_options({"expires": dt.datetime(2029, 12, 31, 23, 59, tzinfo=UTC)}, None, AT)
    with pytest.raises(ScheduleTimeError, match=r"expires=-1 is negative"):
        expiry_options({"expires": -1}, None, AT)


def test_a_schedule_call_keeps_its_expiry_and_refuses_a_bad_one(scheduler: SchedulerTesting) -> None:
    handle = remind.schedule(("c",), {}, countdown=60, expires=START + dt.timedelta(seconds=90))
    assert handle.envelope.options == {"expires": 30.0}
    with pytest.raises(ScheduleTimeError, match="before the task's scheduled time"):
        remind.schedule(("c",), {}, countdown=60, expires=START)


def test_a_task_held_past_its_deadline_expires_and_its_ordering_id_moves_on(
        scheduler: SchedulerTesting) -> None:
    expiring = remind.schedule(("c1",), {"kind": "a"}, countdown=60, expires=30)
    after = remind.schedule(("c1",), {"kind": "b"}, countdown=90)
    pauses.pause(app, ordering_id="c1")
    assert scheduler.advance(300) == []
    pauses.resume(app, ordering_id="c1")
    assert [run.key for run in scheduler.advance(1)] == [after.key]  # expiring never runs
    status = expiring.status()
    assert status is not None and status.state is State.EXPIRED
    with pytest.raises(NotRetryableError, match="it expired"):
        expiring.retry()


def test_a_task_released_in_time_runs_whatever_its_expiry(scheduler: SchedulerTesting) -> None:
    handle = remind.schedule(("c1",), {}, countdown=60, expires=0)
    assert [run.key for run in scheduler.advance(60)] == [handle.key]


def test_the_engine_counts_what_expired() -> None:
    store, clock = MemoryScheduleStore(), FakeClock(NOW)
    released: list[TaskKey] = []
    registry = CollectorRegistry()
    engine = Engine(store, lambda task, release: released.append(task.key), "owner",
                    EngineSettings(tick_seconds=0), clock=clock, metrics=PrometheusMetrics(registry))
    engine.assign([0])
    store.put_pause(Pause(PauseScope.ALL, "", NOW))
    late = TaskKey("c", NOW + 10, "late")
    store_row = store.put(0, ScheduleEnvelope(late, "t", options={"expires": 5}), NOW)
    assert store_row is not None
    engine.persisted(store_row)
    clock.ms += 20_000
    engine.step()
    store.drop_pause(PauseScope.ALL, "")
    clock.ms += 2000
    engine.step()
    assert released == []
    status = store.status(late)
    assert status is not None and status.state is State.EXPIRED
    assert registry.get_sample_value("celery_scheduler_finished_total", {"outcome": "expired"}) == 1
    assert len(engine.timetable) == 0
