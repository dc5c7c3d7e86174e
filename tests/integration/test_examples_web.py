"""The Django and Flask examples through the real services.

Each test starts the example's own dispatcher and worker (``celery -A proj`` /
``celery -A make_celery``) on a topic, keyspace and queue of its own, creates reminders
through the web app's test client, cancels one with the app's command, and waits until the
worker has sent the other. Both reminders belong to one user, so they run in order: once
the later one was sent, the cancelled earlier one would have run if it were going to.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_scheduler.client import SchedulerClient, set_client
from celery_scheduler.config import get_settings
from tests.examples_web import DJANGO_DIR, FLASK_DIR, django_database, django_project, flask_app
from tests.integration.dispatch_fixtures import AppProcesses as ExampleProcesses
from tests.services import drop_scheduler
from tests.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.cassandra, pytest.mark.redis, pytest.mark.timeout(90)]

TIMEOUT = 45


@pytest.fixture
def run_example(kafka_bootstrap: str, cassandra_contact: str, redis_url: str, unique_name: str,
                tmp_path: Path) -> Iterator[Callable[..., ExampleProcesses]]:
    started: list[ExampleProcesses] = []

    def run(app: str, directory: Path, env: dict[str, str]) -> ExampleProcesses:
        path = os.pathsep.join([str(directory), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        # the examples' tasks keep their own record (the reminder row): no execution log
        processes = ExampleProcesses({**os.environ, "PYTHONPATH": path, **env}, execlog=tmp_path / "none",
                                     tmp=tmp_path, app=app)
        started.append(processes)
        processes.init()
        processes.start(unique_name)
        return processes

    yield run
    for processes in started:
        processes.stop_all(kill_workers=True)
    if started:
        drop_scheduler(unique_name, unique_name)


def wait_for(what: str, check: Callable[[], Any], processes: ExampleProcesses) -> Any:
    def shown() -> str:
        logs = "\n".join(f"--- {p.args[5]}\n{processes.log_of(p)[-3000:]}" for p in processes.processes)
        return f"{what}\n{logs}"

    return wait_until(check, TIMEOUT, shown, every=0.2)


def send_one_cancel_one(create: Callable[[float], int], cancel: Callable[[int], None],
                        status: Callable[[int], dict[str, Any]], processes: ExampleProcesses) -> None:
    """Two reminders of one user, the first cancelled: the second is sent, the first never."""
    cancelled, sent = create(3), create(4)
    cancel(cancelled)

    wait_for("the reminder sent", lambda: status(sent)["sent_at"], processes)
    wait_for("its task succeeded", lambda: status(sent)["status"] == "succeeded", processes)
    # the user's reminders run in order: the cancelled one would have run before this one
    assert status(cancelled)["sent_at"] is None
    assert status(cancelled)["status"] == "cancelled"


def test_django_example_sends_a_reminder_and_keeps_a_cancelled_one(
        run_example: Callable[..., ExampleProcesses], kafka_bootstrap: str, redis_url: str,
        unique_name: str, tmp_path: Path) -> None:
    from django.core.management import call_command
    from django.test import Client

    celery_app = django_project(tmp_path / "db.sqlite3").app
    processes = run_example("proj", DJANGO_DIR, {
        "DJANGO_SETTINGS_MODULE": "proj.settings", "REMINDERS_DATABASE": django_database(),
        "CELERY_BROKER_URL": f"{redis_url}/0", "CELERY_TASK_DEFAULT_QUEUE": unique_name,
        "CELERY_SCHEDULER_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "CELERY_SCHEDULER_KAFKA_TOPIC": unique_name, "CELERY_SCHEDULER_KAFKA_PARTITIONS": "2",
        "CELERY_SCHEDULER_CASSANDRA_KEYSPACE": unique_name})
    # Django read its settings once for the whole test process: point its client here.
    settings = get_settings(celery_app).replace(kafka_bootstrap_servers=kafka_bootstrap,
                                                kafka_topic=unique_name, cassandra_keyspace=unique_name)
    client = SchedulerClient(settings)
    previous = set_client(celery_app, client)
    try:
        web = Client()

        def create(in_seconds: float) -> int:
            response = web.post("/reminders/", json.dumps({"user": unique_name, "text": "renew",
                                                           "in_seconds": in_seconds}),
                                content_type="application/json")
            assert response.status_code == 201, response.content
            reminder_id: int = response.json()["id"]
            return reminder_id

        def status(reminder_id: int) -> dict[str, Any]:
            body: dict[str, Any] = web.get(f"/reminders/{reminder_id}/").json()
            return body

        def cancel(reminder_id: int) -> None:
            call_command("cancel_reminder", str(reminder_id), verbosity=0)

        send_one_cancel_one(create, cancel, status, processes)
    finally:
        set_client(celery_app, previous)
        client.close()


def test_flask_example_sends_a_reminder_and_keeps_a_cancelled_one(
        run_example: Callable[..., ExampleProcesses], kafka_bootstrap: str, redis_url: str,
        unique_name: str, tmp_path: Path) -> None:
    database = tmp_path / "reminders.sqlite"
    celery = {"broker_url": f"{redis_url}/0", "task_default_queue": unique_name,
              "scheduler_kafka_bootstrap_servers": kafka_bootstrap, "scheduler_kafka_topic": unique_name,
              "scheduler_kafka_partitions": 2, "scheduler_cassandra_keyspace": unique_name}
    app = flask_app(database, **celery)
    processes = run_example("make_celery", FLASK_DIR, {
        "FLASK_DATABASE": str(database),
        **{f"FLASK_CELERY__{name}": str(value) for name, value in celery.items()}})
    web = app.test_client()
    try:
        def create(in_seconds: float) -> int:
            response = web.post("/reminders/", json={"user": unique_name, "text": "renew",
                                                     "in_seconds": in_seconds})
            assert response.status_code == 201, response.data
            reminder_id: int = response.json["id"]
            return reminder_id

        def status(reminder_id: int) -> dict[str, Any]:
            body: dict[str, Any] = web.get(f"/reminders/{reminder_id}").json
            return body

        def cancel(reminder_id: int) -> None:
            result = app.test_cli_runner().invoke(args=["cancel-reminder", str(reminder_id)])
            assert result.exit_code == 0, (result.output, result.exception)

        send_one_cancel_one(create, cancel, status, processes)
    finally:
        app.extensions["celery"].close()
