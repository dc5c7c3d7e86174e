"""Bulk cancel: a selection's pending keys are cancelled through the dispatcher's own cancel
path, released ones are left and reported apart, and a dry run changes nothing."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from types import SimpleNamespace

import pytest
from click.testing import CliRunner, Result
from fastapi.testclient import TestClient

from celery_scheduler.bulk_cancel import BulkCancel, Selection, cancel_many, settle, sort_out
from celery_scheduler.cli import scheduler as scheduler_command
from celery_scheduler.client import get_client
from celery_scheduler.envelope import ScheduleEnvelope
from celery_scheduler.errors import SelectionError
from celery_scheduler.keys import TaskKey
from celery_scheduler.store.records import State, StoredTask, TaskStatus
from celery_scheduler.testing import SchedulerTesting
from celery_scheduler.web import create_app
from tests.unit.apps import app, charge, remind
from tests.unit.conftest import START

UTC = dt.timezone.utc
READ = {"Authorization": "Bearer read-token-0123456789"}
WRITE = {"Authorization": "Bearer write-token-0123456789"}


def test_a_selection_needs_a_criterion_an_aware_time_and_a_span() -> None:
    with pytest.raises(SelectionError, match="at least one of"):
        Selection()
    with pytest.raises(SelectionError, match=r"due_from must be a timezone-aware.*2030"):
        Selection(due_from=dt.datetime(2030, 1, 1))  # the error under test
    with pytest.raises(SelectionError, match="span is empty"):
        Selection(task="t", due_from=START, due_before=START)


def test_pending_keys_of_an_ordering_id_are_cancelled_and_others_run(
        scheduler: SchedulerTesting) -> None:
    theirs = [remind.schedule_in(60 * n, "c1", kind=f"k{n}") for n in range(1, 8)]
    other = remind.schedule_in(120, "c2", kind="k2")
    scheduler.advance(0)  # stored by the dispatcher
    said: list[int] = []
    report = cancel_many(get_client(app), Selection(ordering_id="c1"), page=3, keep_keys=True,
                         progress=lambda so_far: said.append(so_far.requested))
    assert (report.matched, report.requested, report.released) == (7, 7, 0)
    assert said == [3, 6, 7]  # a page at a time
    assert report.examples["requested"] == [h.key for h in theirs]
    runs = scheduler.advance(dt.timedelta(hours=1))
    assert [run.key for run in runs] == [other.key]
    settle(get_client(app), report, timeout=0)
    assert (report.cancelled, report.released_first, report.unsettled) == (7, 0, 0)
    for handle in theirs:
        status = handle.status()
        assert status is not None and status.state is State.CANCELLED


def test_a_dry_run_counts_and_changes_nothing(scheduler: SchedulerTesting) -> None:
    handles = [remind.schedule_in(60 * n, "c1", kind=f"k{n}") for n in range(1, 4)]
    scheduler.advance(0)
    report = cancel_many(get_client(app), Selection(ordering_id="c1"), dry_run=True)
    assert (report.dry_run, report.requested) == (True, 3)
    assert "3 pending, would be cancelled" in report.summary()
    assert settle(get_client(app), report, timeout=0).cancelled is None
    runs = scheduler.advance(dt.timedelta(hours=1))
    assert sorted(run.key for run in runs) == sorted(h.key for h in handles)


def test_a_task_name_and_a_span_select_across_ordering_ids(scheduler: SchedulerTesting) -> None:
    early = remind.schedule_in(60, "c1", kind="early")
    inside = [remind.schedule_in(600, f"c{n}", kind="inside") for n in range(5)]
    charged = charge.schedule_in(600, 7, 10)
    late = remind.schedule_in(3600, "c1", kind="late")
    scheduler.advance(0)
    selection = Selection(task="unit.remind", due_from=START + dt.timedelta(minutes=5),
                          due_before=START + dt.timedelta(minutes=30))
    report = cancel_many(get_client(app), selection)
    assert report.requested == len(inside)
    runs = scheduler.advance(dt.timedelta(hours=2))
    assert sorted(run.key for run in runs) == sorted([early.key, charged.key, late.key])


def row_of(key: TaskKey, lease_until_ms: int = 0) -> StoredTask:
    return StoredTask(0, 0, ScheduleEnvelope(key, "unit.remind"), lease_until_ms=lease_until_ms)


def test_a_released_key_is_left_to_run_and_a_cancelled_one_counted_apart() -> None:
    marked, running, waiting, done, unknown, blocked = (TaskKey("c1", n, f"k{n}") for n in range(1, 7))
    rows = [row_of(marked, lease_until_ms=300_000), row_of(running), row_of(waiting), row_of(done),
            row_of(unknown), dataclasses.replace(row_of(blocked), blocked=True)]
    statuses = [None, TaskStatus(running, State.RELEASED, "unit.remind", 0),
                TaskStatus(waiting, State.PENDING, "unit.remind", 0),
                TaskStatus(done, State.CANCELLED, "unit.remind", 0), None,
                TaskStatus(blocked, State.FAILED, "unit.remind", 0)]
    found = sort_out(rows, statuses)
    # a row marked released (its lease set) is released whatever its status says so far; a
    # blocked one (failed, holding its ordering id) is cancelled, which frees the others
    assert (found.pending, found.released, found.cancelled) == (
        [waiting, unknown, blocked], [marked, running], [done])


def test_a_summary_says_what_each_count_is() -> None:
    report = BulkCancel(Selection(ordering_id="c1"), dry_run=False, requested=5, released=2,
                        already_cancelled=1)
    text = report.summary()
    assert text.startswith("8 key(s) match ordering id 'c1': 5 pending, cancel requested; "
                           "2 already released")


def cli(*arguments: str, answer: str = "") -> Result:
    return CliRunner().invoke(scheduler_command, ["cancel-many", *arguments],
                              obj=SimpleNamespace(app=app), input=answer)


def test_the_cli_counts_asks_then_cancels_and_refuses_an_empty_selection(
        scheduler: SchedulerTesting) -> None:
    handles = [remind.schedule_in(60 * n, "c1", kind=f"k{n}") for n in range(1, 4)]
    kept = remind.schedule_in(60, "c2", kind="kept")
    scheduler.advance(0)
    refused = cli()
    assert refused.exit_code == 1 and "at least one of" in refused.output
    dry = cli("--ordering-id", "c1", "--dry-run", "--json")
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.output[dry.output.index("{"):])["requested"] == 3
    declined = cli("--ordering-id", "c1", answer="n\n")
    assert declined.exit_code == 1 and "3 pending, would be cancelled" in declined.output
    assert scheduler.cancelled() == []
    done = cli("--ordering-id", "c1", "--before", "2030-01-01T09:02:30", answer="y\n")
    assert done.exit_code == 0, done.output
    assert "2 pending, cancel requested" in done.output
    runs = scheduler.advance(dt.timedelta(hours=1))
    assert sorted(run.key for run in runs) == sorted([kept.key, handles[2].key])


def test_the_api_cancels_with_a_write_token_and_says_what_it_left(
        scheduler: SchedulerTesting) -> None:
    handles = [remind.schedule_in(60 * n, "c1", kind=f"k{n}") for n in range(1, 4)]
    scheduler.advance(0)
    http = TestClient(create_app(app))
    call = {"ordering_id": "c1", "dry_run": True}
    assert http.post("/api/v1/cancel-many", json=call, headers=READ).status_code == 403
    counted = http.post("/api/v1/cancel-many", json=call, headers=WRITE)
    assert counted.status_code == 200, counted.text
    assert (counted.json()["requested"], counted.json()["cancelled"]) == (3, None)
    empty = http.post("/api/v1/cancel-many", json={"dry_run": True}, headers=WRITE)
    assert (empty.status_code, empty.json()["error"]) == (422, "SelectionError")
    backwards = http.post("/api/v1/cancel-many", headers=WRITE, json={
        "task": "unit.remind", "due_from": "2030-01-01T10:00:00Z", "due_before": "2030-01-01T09:00:00"})
    assert backwards.status_code == 422 and "span is empty" in backwards.json()["message"]
    done = http.post("/api/v1/cancel-many", json={"ordering_id": "c1"}, headers=WRITE)
    assert done.status_code == 200 and done.json()["requested"] == 3
    assert done.json()["examples"]["requested"] == [str(h.key) for h in handles]
    assert scheduler.advance(dt.timedelta(hours=1)) == []


def test_the_console_counts_then_cancels_an_ordering_ids_pending_tasks(
        scheduler: SchedulerTesting) -> None:
    for n in range(1, 4):
        remind.schedule_in(60 * n, "c/1", kind=f"k{n}")
    scheduler.advance(0)
    reader = TestClient(create_app(app))
    page = reader.get("/ordering-ids/c%2F1?token=read-token-0123456789")
    assert page.status_code == 200 and "cancel-many" not in page.text
    assert reader.post("/ordering-ids/c%2F1/cancel").status_code == 403
    http = TestClient(create_app(app))
    page = http.get("/ordering-ids/c%2F1?token=write-token-0123456789")
    assert 'action="/ordering-ids/c%2F1/cancel"' in page.text
    asked = http.get("/ordering-ids/c%2F1/cancel")
    assert asked.status_code == 200 and "3 pending, would be cancelled" in asked.text
    assert "Cancel 3 pending task(s)" in asked.text and scheduler.cancelled() == []
    done = http.post("/ordering-ids/c%2F1/cancel")
    assert done.status_code == 200 and "3 pending, cancel requested" in done.text
    assert "Cancel 3 pending" not in done.text
    assert scheduler.advance(dt.timedelta(hours=1)) == []
