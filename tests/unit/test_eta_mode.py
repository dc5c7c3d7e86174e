"""The drop-in eta mode: apply_async(eta=/countdown=) of a DurableEtaTask, through the scheduler."""

from __future__ import annotations

import datetime as dt
import pickle
from collections.abc import Iterator

import pytest
from celery.result import AsyncResult

from celery_scheduler import eta
from celery_scheduler.errors import ScheduleError, ScheduleTimeError
from celery_scheduler.eta import ScheduledResult
from celery_scheduler.store.base import State
from celery_scheduler.testing import SchedulerTesting, scheduler_testing
from tests.unit.apps import app, calls, eta_reminder

UTC = dt.timezone.utc
START = dt.datetime(2030, 1, 1, 9, 0, tzinfo=UTC)


@pytest.fixture
def scheduler() -> Iterator[SchedulerTesting]:
    calls.clear()
    with scheduler_testing(app, start=START) as testing:
        yield testing


def test_a_countdown_is_scheduled_and_runs_with_the_task_id_it_returned(
        scheduler: SchedulerTesting) -> None:
    result = eta_reminder.apply_async(("c1",), countdown=3600)
    assert isinstance(result, ScheduledResult)
    [envelope] = scheduler.pending()
    assert envelope.key.ordering_id == envelope.key.uniqueness_key == result.id
    assert envelope.key.scheduled_at == START + dt.timedelta(hours=1)
    assert scheduler.advance(3599) == []
    [run] = scheduler.advance(1)
    assert run.result.id == result.id and run.result.get() == "reminded c1"
    status = result.schedule_status()
    assert status is not None and status.state is State.SUCCEEDED


def test_an_eta_in_the_apps_timezone_like_celery(scheduler: SchedulerTesting) -> None:
    eta_reminder.apply_async(("c1",), eta=START + dt.timedelta(days=3))
    eta_reminder.apply_async(("c2",), eta=(START + dt.timedelta(days=4)).isoformat())
    eta_reminder.apply_async(("c3",), eta=dt.datetime(2030, 1, 6, 9, 0))  # naive: app.timezone (UTC)
    assert [e.key.scheduled_at for e in scheduler.pending()] == [
        START + dt.timedelta(days=n) for n in (3, 4, 5)]


def test_the_same_task_id_is_scheduled_once(scheduler: SchedulerTesting) -> None:
    for _ in range(2):
        eta_reminder.apply_async(("c1",), countdown=60, task_id="reminder-c1")
    assert len(scheduler.advance(60)) == 1 and calls == [("c1", "eta")]


def test_the_same_task_id_called_again_later_moves_the_task_and_never_runs_twice(
        scheduler: SchedulerTesting) -> None:
    """A call made again with its task id (a retried request, say) computes a later eta: the
    task moves there, with the later call's arguments, and runs once."""
    first = eta_reminder.apply_async(("c1",), countdown=60, task_id="reminder-c1")
    scheduler.advance(5)
    again = eta_reminder.apply_async(("c2",), countdown=60, task_id="reminder-c1")
    assert scheduler.advance(55) == []  # the first eta passed: it moved
    [run] = scheduler.advance(5)
    assert run.result.id == "reminder-c1" and calls == [("c2", "eta")]
    moved, ran = first.schedule_status(), again.schedule_status()
    assert moved is not None and moved.state is State.RESCHEDULED
    assert ran is not None and ran.state is State.SUCCEEDED
    # once it ran (or was revoked), the task id is spent: a call with it runs nothing
    eta_reminder.apply_async(("c3",), countdown=60, task_id="reminder-c1")
    revoked = eta_reminder.apply_async(("c4",), countdown=60, task_id="reminder-c4")
    revoked.revoke()
    scheduler.advance(1)
    eta_reminder.apply_async(("c5",), countdown=90, task_id="reminder-c4")
    assert scheduler.advance(3600) == [] and calls == [("c2", "eta")]


def test_revoking_the_result_or_the_id_cancels_it(scheduler: SchedulerTesting) -> None:
    first = eta_reminder.apply_async(("c1",), countdown=60)
    second = eta_reminder.apply_async(("c2",), countdown=60)
    scheduler.advance(1)  # stored by the dispatcher
    first.revoke()
    assert eta.revoke(app, second.id) == 1
    assert eta.revoke(app, "no-such-id") == 0
    assert scheduler.advance(120) == [] and calls == []
    status = first.schedule_status()
    assert status is not None and status.state is State.CANCELLED


def test_status_by_task_id(scheduler: SchedulerTesting) -> None:
    result = eta_reminder.apply_async(("c1",), countdown=60)
    assert eta.status(app, result.id) is None  # not stored yet
    scheduler.advance(1)
    status = eta.status(app, result.id)
    assert status is not None and status.state is State.PENDING


def test_calls_without_a_delay_or_under_the_threshold_go_to_celery(
        scheduler: SchedulerTesting, monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[tuple[object, dict[str, object]]] = []
    monkeypatch.setattr("celery.app.task.Task.apply_async",
                        lambda self, args=None, kwargs=None, *rest, **options: sent.append((args, options)))
    eta_reminder.apply_async(("c1",))
    eta_reminder.delay("c2")
    settings = eta.get_settings(app)
    monkeypatch.setattr(app, "_celery_scheduler_settings", settings.replace(eta_threshold_seconds=30))
    eta_reminder.apply_async(("c3",), countdown=10)
    eta_reminder.apply_async(("c4",), countdown=30)  # at the threshold: scheduled
    assert [args for args, _ in sent] == [("c1",), ("c2",), ("c3",)]
    assert [e.args for e in scheduler.pending()] == [["c4"]]


def test_options_the_scheduler_cannot_carry_are_refused_with_their_names(
        scheduler: SchedulerTesting) -> None:
    with pytest.raises(ScheduleError, match="link"):
        eta_reminder.apply_async(("c1",), countdown=60, link=eta_reminder.s("c2"))
    with pytest.raises(ScheduleError, match="stamped_headers"):
        eta_reminder.apply_async(("c1",), countdown=60, stamped_headers=["x"])
    with pytest.raises(ScheduleTimeError, match="countdown"):
        eta_reminder.apply_async(("c1",), countdown="soon")
    with pytest.raises(ScheduleTimeError, match="ISO 8601"):
        eta_reminder.apply_async(("c1",), eta="tomorrow")
    assert scheduler.pending() == []
    # Celery's own options that make no difference are accepted, Celery options are kept
    eta_reminder.apply_async(("c1",), countdown=60, retry=True, serializer="json", queue="mail")
    [envelope] = scheduler.pending()
    assert envelope.options["queue"] == "mail"


def test_the_result_travels_as_an_ordinary_async_result(scheduler: SchedulerTesting) -> None:
    result = eta_reminder.apply_async(("c1",), countdown=60)
    copy = pickle.loads(pickle.dumps(result))
    assert type(copy) is AsyncResult and copy.id == result.id
