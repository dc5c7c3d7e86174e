"""The operators' log: every lever notes who did what to what, newest first, on the CLI,
the HTTP API and the console; a line that cannot be written leaves the action done."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from celery_scheduler import audit, pauses, periodic_admin
from celery_scheduler.bulk_cancel import Selection, cancel_many
from celery_scheduler.cli import scheduler as scheduler_command
from celery_scheduler.client import get_client
from celery_scheduler.errors import StoreUnavailableError
from celery_scheduler.testing import SchedulerTesting
from celery_scheduler.web import create_app
from tests.unit.apps import app, remind

READ = {"Authorization": "Bearer read-token-0123456789"}
WRITE = {"Authorization": "Bearer write-token-0123456789"}


def test_each_lever_is_noted_with_who_did_it_newest_first(scheduler: SchedulerTesting) -> None:
    handle = remind.schedule_in(600, "c1", kind="a")
    scheduler.advance(0)
    pauses.pause(app, ordering_id="c1", reason="incident 9", by="ana")
    scheduler.advance(1)
    pauses.resume(app, ordering_id="c1", by="ana")
    scheduler.advance(1)
    cancel_many(get_client(app), Selection(ordering_id="c1"), by="bo")
    cancel_many(get_client(app), Selection(ordering_id="c1"), dry_run=True, by="bo")  # not noted
    lines = [(a.actor, a.action, a.target, a.detail) for a in audit.recent(app)]
    assert lines == [
        ("bo", "cancel-many", "ordering id 'c1'",
         "1 cancel(s) requested, 0 released already left to run"),
        ("ana", "resume", "ordering_id 'c1'", ""),
        ("ana", "pause", "ordering_id 'c1'", "incident 9"),
    ], lines
    assert audit.recent(app, limit=1)[0].action == "cancel-many"
    assert handle.key is not None


def test_the_cli_the_api_and_the_console_show_the_log(scheduler: SchedulerTesting) -> None:
    http = TestClient(create_app(app))
    assert http.post("/api/v1/pauses", json={"scope": "all"}, headers=WRITE).status_code == 200
    out = CliRunner().invoke(scheduler_command, ["audit", "--json"], obj=SimpleNamespace(app=app))
    [line] = json.loads(out.output)
    assert (line["action"], line["target"]) == ("pause", "everything")
    assert line["actor"].startswith("HTTP API from ")
    shown = http.get("/api/v1/audit?limit=5", headers=READ).json()
    assert [(a["action"], a["target"]) for a in shown] == [("pause", "everything")]
    page = http.get("/audit?token=read-token-0123456789")
    assert page.status_code == 200 and "everything" in page.text and "HTTP API from" in page.text
    text = CliRunner().invoke(scheduler_command, ["audit"], obj=SimpleNamespace(app=app)).output
    assert " pause everything" in text


def test_a_cli_action_is_noted_as_the_user_at_the_host(scheduler: SchedulerTesting) -> None:
    assert CliRunner().invoke(scheduler_command, ["pause", "--task", remind.name],
                              obj=SimpleNamespace(app=app)).exit_code == 0
    [line] = audit.recent(app)
    assert line.actor == audit.operator() and "@" in line.actor


def test_periodic_changes_are_noted(scheduler: SchedulerTesting) -> None:
    periodic_admin.add(app, "sweep", {"task": remind.name, "schedule": 600, "args": ["c"]}, by="ops")
    periodic_admin.pause(app, "sweep", by="ops")
    assert [(a.action, a.target) for a in audit.recent(app)] == [
        ("periodic pause", "sweep"), ("periodic add", "sweep")]


def test_an_empty_log_says_so(scheduler: SchedulerTesting) -> None:
    out = CliRunner().invoke(scheduler_command, ["audit"], obj=SimpleNamespace(app=app))
    assert out.exit_code == 0 and out.output == "no operator action is on record\n"


def test_a_line_that_cannot_be_written_leaves_the_action_done(
        scheduler: SchedulerTesting, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    store = get_client(app).store

    def down(action: object) -> None:
        raise StoreUnavailableError("Cassandra could not answer: down")

    monkeypatch.setattr(store, "note_action", down)
    with caplog.at_level(logging.WARNING, logger="celery_scheduler.audit"):
        pauses.pause(app, ordering_id="c1")
    assert [p.value for p in pauses.in_force(app)] == ["c1"]
    assert "pause of ordering_id 'c1' was done, but could not be written" in caplog.text
