"""The HTTP API against the memory task log and store (the testing helper's)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import replace as dc_replace
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient

from celery_scheduler.testing import SchedulerRecorder, scheduler_testing
from celery_scheduler.web import create_app
from tests.unit.apps import app, failures_left, flaky, remind

READ = {"Authorization": "Bearer read-token-0123456789"}
WRITE = {"Authorization": "Bearer write-token-0123456789"}
UTC = dt.timezone.utc


@pytest.fixture
def web() -> Iterator[tuple[TestClient, SchedulerRecorder]]:
    with scheduler_testing(app) as recorder:
        yield TestClient(create_app(app)), recorder


def test_a_write_token_schedules_a_registered_task_and_a_read_token_may_not(
        web: tuple[TestClient, SchedulerRecorder]) -> None:
    http, recorder = web
    when = (dt.datetime.now(UTC) + dt.timedelta(hours=1)).replace(microsecond=0)
    call = {"task": "unit.remind", "args": ["customer-42"], "kwargs": {"kind": "welcome"},
            "at": when.isoformat(), "options": {"queue": "mail"}}
    assert http.post("/api/v1/tasks", json=call).status_code == 401
    refused = http.post("/api/v1/tasks", json=call, headers=READ)
    assert refused.status_code == 403 and refused.json()["error"] == "Forbidden"
    made = http.post("/api/v1/tasks", json=call, headers=WRITE)
    assert made.status_code == 201, made.text
    body = made.json()
    assert (body["ordering_id"], body["uniqueness_key"], body["at"]) == (
        "customer-42", "welcome", when.isoformat())
    [envelope] = recorder.pending()
    assert envelope.key.task_id == body["task_id"] and envelope.options == {"queue": "mail"}


def test_bad_calls_get_a_status_and_a_message_never_a_500(
        web: tuple[TestClient, SchedulerRecorder]) -> None:
    http, _ = web
    cases = [
        ({"task": "unit.nothing", "countdown": 60}, 404, "NotFound"),
        ({"task": "unit.remind", "args": ["c"]}, 422, "ScheduleTimeError"),  # neither at nor countdown
        ({"task": "unit.remind", "args": ["c"], "countdown": 60, "options": {"serializer": "pickle"}},
         422, "ScheduleError"),
        ({"task": "unit.remind", "args": ["c"], "countdown": 60, "options": {"at": "x", "wait": False}},
         422, "ScheduleError"),
        ({"task": "unit.remind", "args": [], "countdown": 60}, 422, "ScheduleError"),
        ({"task": "unit.remind", "args": ["c"], "countdown": "soon"}, 422, "InvalidRequest"),
        ({"args": ["c"]}, 422, "InvalidRequest"),
    ]
    for call, status, error in cases:
        answer = http.post("/api/v1/tasks", json=call, headers=WRITE)
        assert (answer.status_code, answer.json()["error"]) == (status, error), (call, answer.text)
        assert answer.json()["message"]


def test_status_and_cancel_of_a_key(web: tuple[TestClient, SchedulerRecorder]) -> None:
    http, recorder = web
    scheduled = remind.schedule_in(3600, "c", kind="k")
    key = scheduled.key
    path = f"/api/v1/tasks/c/{key.scheduled_at.isoformat()}/k"
    assert http.get(path, headers=READ).status_code == 404  # not stored by a dispatcher yet
    recorder.store.put(0, scheduled.envelope, key.scheduled_ms - 1000)
    shown = http.get(path, headers=READ)
    assert shown.status_code == 200 and shown.json()["state"] == "pending"
    assert shown.json()["args"] == '["c"]'
    assert http.delete(path, headers=READ).status_code == 403
    assert http.delete(path, headers=WRITE).status_code == 202
    assert recorder.pending() == []  # the cancel went through the task log
    bad = http.get("/api/v1/tasks/c/not-a-time/k", headers=READ)
    assert (bad.status_code, bad.json()["error"]) == (422, "ScheduleTimeError")


def test_partitions_and_the_openapi_document(web: tuple[TestClient, SchedulerRecorder]) -> None:
    http, _ = web
    views = http.get("/api/v1/partitions", headers=READ)
    assert views.status_code == 200 and len(views.json()) == 12
    document = http.get("/openapi.json").json()
    assert {"/api/v1/tasks", "/api/v1/partitions", "/api/v1/dead-letters"} <= set(document["paths"])
    assert "HTTPBearer" in document["components"]["securitySchemes"]


def test_pages_need_a_token_and_keep_it(web: tuple[TestClient, SchedulerRecorder]) -> None:
    http, _ = web
    assert http.get("/").status_code == 401
    page = http.get("/?token=read-token-0123456789")
    assert page.status_code == 200
    assert "0 of 12 partitions leased" in page.text
    assert http.get("/").status_code == 200  # the cookie


def test_an_ordering_ids_tasks_in_the_api_and_on_its_timeline_page(
        web: tuple[TestClient, SchedulerRecorder]) -> None:
    http, scheduler = web
    failures_left.clear()
    failures_left["c1"] = 1
    first = flaky.schedule_in(10, "c1", "first")
    flaky.schedule_in(20, "c1", "second")
    flaky.schedule_in(30, "c2", "elsewhere")
    [run] = scheduler.advance(10)  # the first fails once, and waits for its retry
    assert not run.succeeded
    listed = http.get("/api/v1/ordering-ids/c1/tasks", headers=READ)
    assert listed.status_code == 200, listed.text
    tasks = listed.json()
    assert [(t["unique"], t["state"], t["attempts"]) for t in tasks] == [
        ("first", "pending", 1), ("second", "pending", 0)]
    assert tasks[0]["task_id"] == first.key.task_id and tasks[0]["not_before"] is not None
    assert tasks[0]["last_error"] == "RuntimeError: c1 is not ready"
    assert http.get("/api/v1/ordering-ids/nobody/tasks", headers=READ).json() == []
    assert http.get("/api/v1/ordering-ids/c1/tasks").status_code == 401

    page = http.get("/ordering-ids/c1?token=read-token-0123456789")
    assert page.status_code == 200
    assert "2 task(s) waiting" in page.text and "retry after" in page.text
    assert page.text.index(">first<") < page.text.index(">second<")
    assert "elsewhere" not in page.text
    found = http.get("/ordering-ids?ordering_id=c1", follow_redirects=False)
    assert found.status_code == 303 and found.headers["location"] == "/ordering-ids/c1"


def test_what_falls_due_next_per_bucket(web: tuple[TestClient, SchedulerRecorder]) -> None:
    http, scheduler = web
    start = scheduler.clock.ms
    for n in range(3):
        remind.schedule_at(dt.datetime.fromtimestamp(start / 1000 + 65, UTC), f"soon-{n}")
    remind.schedule_at(dt.datetime.fromtimestamp(start / 1000 + 300, UTC), "later")
    remind.schedule_at(dt.datetime.fromtimestamp(start / 1000 + 7200, UTC), "much-later")
    scheduler.advance(0)  # the dispatcher stores them
    due = http.get("/api/v1/due-soon?buckets=10", headers=READ)
    assert due.status_code == 200, due.text
    body = due.json()
    counts = [bucket["tasks"] for bucket in body["buckets"]]
    assert body["bucket_seconds"] == 60 and body["overdue"] == 0 and len(counts) == 10
    minute = (start // 60_000) * 60_000
    assert counts[(start + 65_000) // 60_000 - minute // 60_000] == 3
    assert counts[(start + 300_000) // 60_000 - minute // 60_000] == 1
    assert sum(counts) == 4  # the one two hours ahead is past the ten buckets
    assert body["buckets"][0]["start"] == dt.datetime.fromtimestamp(minute / 1000, UTC).isoformat()
    page = http.get("/?token=read-token-0123456789")
    assert "Due soon" in page.text and page.text.count('class="bar"') == 30


WRITE_TOKEN = "write-token-0123456789"


def test_failed_and_blocked_tasks_listed_and_a_blocked_one_cancelled_from_the_page(
        web: tuple[TestClient, SchedulerRecorder], monkeypatch: pytest.MonkeyPatch) -> None:
    http, scheduler = web
    failures_left.clear()
    failures_left.update({"c1": 10, "c2": 10})
    flaky.schedule_in(10, "c1", "first")
    scheduler.advance(dt.timedelta(minutes=5))  # three attempts: failed for good
    # from now on the dispatcher blocks an ordering id whose task fails its last attempt
    monkeypatch.setattr(scheduler.engine.settler, "settings",
                        dc_replace(scheduler.engine.settings, on_exhausted="block"))
    flaky.schedule_in(10, "c2", "stuck")
    flaky.schedule_in(20, "c2", "behind")
    scheduler.advance(dt.timedelta(minutes=5))  # blocked: "behind" waits

    listed = http.get("/api/v1/tasks?state=failed", headers=READ)
    assert listed.status_code == 200, listed.text
    assert [(t["ordering_id"], t["unique"], t["note"].split(" ")[0]) for t in listed.json()] == [
        ("c1", "first", "failed"), ("c2", "stuck", "blocked:")]
    assert listed.json()[0]["last_error"] == "RuntimeError: c1 is not ready"
    blocked = http.get("/api/v1/tasks?state=blocked", headers=READ).json()
    assert [(t["unique"], t["attempts"]) for t in blocked] == [("stuck", 3)]  # flaky's max_attempts
    assert http.get("/api/v1/tasks?state=pending", headers=READ).status_code == 422

    page = http.get("/attention?token=read-token-0123456789")
    assert "2 failed task(s)" in page.text and "<button>" not in page.text  # read only
    page = http.get(f"/attention?token={WRITE_TOKEN}")
    assert page.text.count("<button>Cancel</button>") == 1  # the blocked one
    path = f"/tasks/c2/{quote(blocked[0]['at'], safe='')}/stuck/cancel"
    assert http.post(path, follow_redirects=False).status_code == 303
    failures_left["c2"] = 0
    runs = scheduler.advance(60)  # the cancel frees the ordering id
    assert [r.key.uniqueness_key for r in runs] == ["behind"]
