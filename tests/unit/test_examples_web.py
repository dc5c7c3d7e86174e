"""The Django and Flask examples' schedule, cancel and run paths, with the testing helper.

No services: ``scheduler_testing`` sends each schedule and cancel call to memory. The Flask
tests get it as a user's project would: the ``celery_scheduler`` fixture of the package's
pytest plugin, given the app by a ``celery_app`` fixture.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_scheduler.testing import SchedulerTesting, scheduler_testing
from tests.examples_web import django_project, flask_app


def new_user() -> str:
    return f"user-{uuid.uuid4().hex[:8]}"


# --- Django --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def django_celery(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return django_project(tmp_path_factory.mktemp("django") / "db.sqlite3").app


@pytest.fixture
def django_scheduler(django_celery: Any) -> Iterator[Any]:
    with scheduler_testing(django_celery) as scheduler:
        yield scheduler


def post_django(user: str, in_seconds: float = 60) -> dict[str, Any]:
    from django.test import Client

    body = json.dumps({"user": user, "text": "renew", "in_seconds": in_seconds})
    response = Client().post("/reminders/", body, content_type="application/json")
    assert response.status_code == 201, response.content
    created: dict[str, Any] = response.json()
    return created


def test_django_view_schedules_the_reminder_for_its_time(django_scheduler: Any) -> None:
    from reminders.models import Reminder

    user = new_user()
    created = post_django(user, in_seconds=3600)

    [task] = django_scheduler.pending()
    reminder = Reminder.objects.get(pk=created["id"])
    assert task.task == "reminders.send_reminder"
    assert task.key == reminder.task_key()
    assert task.key.ordering_id == user
    assert task.key.scheduled_at == reminder.remind_at
    assert created["task_id"] == task.key.task_id


def test_django_reminder_runs_when_due(django_scheduler: Any) -> None:
    from reminders.models import Reminder

    created = post_django(new_user())

    [result] = django_scheduler.run_due()
    assert result.get() is True
    assert Reminder.objects.get(pk=created["id"]).sent_at is not None
    assert django_scheduler.pending() == []


def test_django_rolled_back_reminder_is_never_scheduled(django_scheduler: Any) -> None:
    from django.db import transaction
    from reminders.models import Reminder

    user = new_user()
    with transaction.atomic():
        post_django(user)
        transaction.set_rollback(True)  # e.g. a later step of the same request failed

    assert django_scheduler.pending() == []
    assert not Reminder.objects.filter(user=user).exists()


def test_django_status_view_before_a_dispatcher_stored_the_task(django_scheduler: Any) -> None:
    from django.test import Client

    created = post_django(new_user())

    response = Client().get(f"/reminders/{created['id']}/")
    assert response.status_code == 200
    assert response.json()["status"] == "unknown"
    assert Client().get("/reminders/999999999/").status_code == 404


def test_django_cancel_command_cancels_the_task(django_scheduler: Any) -> None:
    from django.core.management import call_command
    from reminders.models import Reminder

    created = post_django(new_user())
    reminder = Reminder.objects.get(pk=created["id"])

    call_command("cancel_reminder", str(reminder.pk), verbosity=0)

    assert django_scheduler.cancelled() == [reminder.task_key()]
    assert django_scheduler.pending() == []
    assert Reminder.objects.get(pk=reminder.pk).cancelled_at is not None


def test_django_bad_request_schedules_nothing(django_scheduler: Any) -> None:
    from django.test import Client

    response = Client().post("/reminders/", json.dumps({"user": "x"}), content_type="application/json")

    assert response.status_code == 400
    assert django_scheduler.pending() == []


# --- Flask ---------------------------------------------------------------------------------


@pytest.fixture
def flask_application(tmp_path: Path) -> Any:
    return flask_app(tmp_path / "reminders.sqlite")


@pytest.fixture
def celery_app(flask_application: Any) -> Any:
    return flask_application.extensions["celery"]


@pytest.fixture
def flask_reminders(flask_application: Any, celery_scheduler: SchedulerTesting) -> tuple[Any, Any]:
    return flask_application, celery_scheduler


def post_flask(app: Any, user: str, in_seconds: float = 60) -> dict[str, Any]:
    response = app.test_client().post("/reminders/", json={"user": user, "text": "renew",
                                                           "in_seconds": in_seconds})
    assert response.status_code == 201, response.data
    body: dict[str, Any] = response.json
    return body


def flask_row(app: Any, reminder_id: int) -> Any:
    from reminders_app import models

    with app.app_context():
        return models.get(reminder_id)


def test_flask_view_schedules_the_reminder_for_its_time(flask_reminders: tuple[Any, Any]) -> None:
    from reminders_app import models

    app, scheduler = flask_reminders
    user = new_user()
    created = post_flask(app, user, in_seconds=3600)

    [task] = scheduler.pending()
    assert task.task == "reminders_app.send_reminder"
    assert task.key == models.task_key(flask_row(app, created["id"]))
    assert task.key.ordering_id == user
    assert created["task_id"] == task.key.task_id


def test_flask_reminder_runs_when_due_in_an_app_context(flask_reminders: tuple[Any, Any]) -> None:
    app, scheduler = flask_reminders
    created = post_flask(app, new_user(), in_seconds=60)

    assert scheduler.advance(59) == []
    [run] = scheduler.advance(2)  # FlaskTask gives the task the app's database
    assert run.result.get() is True
    assert flask_row(app, created["id"])["sent_at"] is not None
    response = app.test_client().get(f"/reminders/{created['id']}")
    assert response.json["status"] == "succeeded"


def test_flask_status_view_before_a_dispatcher_stored_the_task(flask_reminders: tuple[Any, Any]) -> None:
    app, _ = flask_reminders
    created = post_flask(app, new_user())

    response = app.test_client().get(f"/reminders/{created['id']}")
    assert response.status_code == 200
    assert response.json["status"] == "unknown"
    assert app.test_client().get("/reminders/999999999").status_code == 404


def test_flask_cancel_command_cancels_the_task(flask_reminders: tuple[Any, Any]) -> None:
    from reminders_app import models

    app, scheduler = flask_reminders
    created = post_flask(app, new_user())

    result = app.test_cli_runner().invoke(args=["cancel-reminder", str(created["id"])])

    assert result.exit_code == 0, result.output
    assert scheduler.cancelled() == [models.task_key(flask_row(app, created["id"]))]
    assert scheduler.pending() == []
    assert flask_row(app, created["id"])["cancelled_at"] is not None


def test_flask_bad_request_schedules_nothing(flask_reminders: tuple[Any, Any]) -> None:
    app, scheduler = flask_reminders

    response = app.test_client().post("/reminders/", json={"user": "x"})

    assert response.status_code == 400
    assert scheduler.pending() == []
