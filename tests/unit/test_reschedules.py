"""Reschedule in place: a pending task moves to another time as another key of its ordering
id, keeps its task id, and its old time never fires; a task released already does not move."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

import pytest
from click.testing import CliRunner, Result
from fastapi.testclient import TestClient

from celery_scheduler import audit
from celery_scheduler.cli import scheduler as scheduler_command
from celery_scheduler.decoding import decode
from celery_scheduler.envelope import RescheduleEnvelope, ScheduleEnvelope, encode
from celery_scheduler.errors import (
    EnvelopeDecodeError,
    InvalidKeyError,
    NotReschedulableError,
    ScheduleTimeError,
)
from celery_scheduler.keys import TaskKey
from celery_scheduler.store import lifecycle
from celery_scheduler.store.memory import MemoryScheduleStore
from celery_scheduler.store.records import Put, Reschedule, State, TaskStatus
from celery_scheduler.testing import SchedulerTesting
from celery_scheduler.web import create_app
from celery_scheduler.web.paths import segments
from tests.unit.apps import app, remind
from tests.unit.conftest import START

START_MS = int(START.timestamp() * 1000)
AT = 1_893_456_000_000
KEY = TaskKey("c1", AT, "u")
LATER = TaskKey("c1", AT + 60_000, "u")


def _envelope(key: TaskKey = KEY, *args: object) -> ScheduleEnvelope:
    return ScheduleEnvelope(key, "unit.remind", list(args))


def test_a_reschedule_record_round_trips_and_its_keys_are_checked() -> None:
    record = RescheduleEnvelope(KEY, _envelope(LATER, "x"), 5)
    assert decode(encode(record)) == record
    with pytest.raises(InvalidKeyError, match="keeps the ordering id and uniqueness key"):
        RescheduleEnvelope(KEY, _envelope(TaskKey("c2", AT + 1, "u")))
    with pytest.raises(InvalidKeyError, match="scheduled at that time already"):
        RescheduleEnvelope(KEY, _envelope(KEY))
    bad = encode(record).replace(b'"ordering_id":"c1","unique":"u"},"kwargs"',
                                 b'"ordering_id":"c9","unique":"u"},"kwargs"')
    with pytest.raises(EnvelopeDecodeError, match="keeps the ordering id"):
        decode(bad)


def _status(state: State, attempts: int = 0) -> TaskStatus:
    return TaskStatus(KEY, state, "unit.remind", 0, attempts=attempts, bucket=1)


@pytest.mark.parametrize(("status", "reason"), [
    (None, "unknown"),
    (_status(State.RELEASED), "released to the workers already"),
    (_status(State.PENDING, attempts=1), "waits to be retried after attempt 1"),
    (_status(State.SUCCEEDED), "succeeded already"),
    (_status(State.CANCELLED), "cancel is final"),
    (_status(State.RESCHEDULED), "rescheduled already, to None"),
])
def test_only_a_key_never_released_may_move(status: TaskStatus | None, reason: str) -> None:
    problem = lifecycle.reschedule_problem(status, None, LATER)
    assert problem is not None and reason in problem
    assert lifecycle.reschedule_problem(_status(State.PENDING), None, LATER) is None
    # read again after it moved there: it may go on (the put is written again)
    assert lifecycle.reschedule_problem(_status(State.RESCHEDULED), LATER, LATER) is None


def test_the_store_moves_a_pending_key_and_keeps_where_it_went() -> None:
    store = MemoryScheduleStore()
    store.put(0, _envelope(KEY, "a"), AT - 10_000)
    stored = store.reschedule(0, KEY, _envelope(LATER, "b"), AT - 5_000)
    assert stored is not None and stored.key == LATER and stored.envelope.args == ["b"]
    old = store.status(KEY)
    assert old is not None and old.state is State.RESCHEDULED
    kept = store.kept_envelope(KEY)
    assert kept is not None and kept.key == LATER
    assert store.task(KEY) is None  # its row went
    new = store.status(LATER)
    assert new is not None and new.state is State.PENDING
    # applied again (a batch read again): the same move, the put written again
    assert store.reschedule(0, KEY, _envelope(LATER, "b"), AT - 4_000) is not None
    # a second move of the old key (to another time) is refused: move the new key instead
    assert store.reschedule(0, KEY, _envelope(TaskKey("c1", AT + 1, "u")), AT - 3_000) is None
    # a schedule record of the old key read again does not bring it back
    assert store.put(0, _envelope(KEY, "a"), AT - 2_000) is None


def test_a_key_released_or_onto_a_key_that_ran_does_not_move() -> None:
    store = MemoryScheduleStore()
    task = store.put(0, _envelope(KEY), AT - 10_000)
    assert task is not None
    store.mark_released(task, 1, AT + 30_000, AT)
    assert store.reschedule(0, KEY, _envelope(LATER), AT + 1) is None
    assert store.status(LATER) is None
    other = TaskKey("c1", AT, "v")
    ran = store.put(0, _envelope(TaskKey("c1", AT + 5_000, "v")), AT - 10_000)
    store.put(0, _envelope(other), AT - 10_000)
    assert ran is not None
    store.finish(ran, State.SUCCEEDED, None, AT)
    assert store.reschedule(0, other, _envelope(TaskKey("c1", AT + 5_000, "v")), AT) is None
    status = store.status(other)
    assert status is not None and status.state is State.PENDING


def test_apply_takes_a_reschedule_with_other_operations() -> None:
    store = MemoryScheduleStore()
    store.put(0, _envelope(KEY), AT - 10_000)
    results = store.apply([Reschedule(0, KEY, _envelope(LATER)),
                           Put(0, _envelope(TaskKey("c2", AT, "u")))], AT - 1_000)
    assert [r.key for r in results if not isinstance(r, bool) and r is not None] == [
        LATER, TaskKey("c2", AT, "u")]


def test_a_handle_moves_its_task_and_the_old_time_never_fires(scheduler: SchedulerTesting) -> None:
    handle = remind.schedule_in(60, "c1", "early")
    moved = handle.reschedule(countdown=120, args=["c1", "late"])
    assert moved.key == TaskKey("c1", handle.key.scheduled_ms + 60_000, "early")
    assert moved.task_id == handle.task_id  # AsyncResult still finds its run
    assert scheduler.advance(90) == []
    status = handle.status()
    assert status is not None and status.state is State.RESCHEDULED
    runs = scheduler.advance(60)
    assert [(run.key, run.envelope.args, run.at, run.result.result) for run in runs] == [
        (moved.key, ["c1", "late"], START + dt.timedelta(seconds=120), "c1:late")]
    with pytest.raises(NotReschedulableError, match="succeeded already"):
        moved.reschedule(countdown=10)
    with pytest.raises(NotReschedulableError, match="rescheduled already, to"):
        handle.reschedule(countdown=30)


def test_a_task_moves_before_the_tasks_of_its_ordering_id_it_now_precedes(
        scheduler: SchedulerTesting) -> None:
    first = remind.schedule_in(60, "c1", "a")
    second = remind.schedule_in(90, "c1", "b")
    moved = second.reschedule(countdown=30)
    scheduler.advance(1)  # applied before its new time
    assert [run.key for run in scheduler.advance(100)] == [moved.key, first.key]


def test_a_released_task_is_refused_with_the_reason(scheduler: SchedulerTesting) -> None:
    handle = remind.schedule_in(10, "c1", "a")
    runs = scheduler.advance(10)
    assert [run.key for run in runs] == [handle.key]
    with pytest.raises(NotReschedulableError, match="succeeded already"):
        handle.reschedule(countdown=60)
    with pytest.raises(ScheduleTimeError, match="exactly one of at= and countdown="):
        handle.reschedule()


def test_a_key_is_moved_by_the_task_and_its_task_is_read_from_the_store(
        scheduler: SchedulerTesting) -> None:
    handle = remind.schedule_in(60, "c1", "a")
    scheduler.advance(1)
    new_key = remind.reschedule(handle.key, START + dt.timedelta(seconds=300))
    assert new_key == TaskKey("c1", handle.key.scheduled_ms + 240_000, "a")
    assert scheduler.advance(200) == []
    assert [run.key for run in scheduler.advance(100)] == [new_key]
    with pytest.raises(NotReschedulableError, match="unknown"):
        remind.reschedule(TaskKey("c9", AT, "u"), countdown=5)


READ = {"Authorization": "Bearer read-token-0123456789"}
WRITE = {"Authorization": "Bearer write-token-0123456789"}


def _cli(*words: str) -> Result:
    return CliRunner().invoke(scheduler_command, list(words), obj=SimpleNamespace(app=app))


def test_the_cli_moves_a_key_notes_it_and_inspect_shows_both_keys(scheduler: SchedulerTesting) -> None:
    handle = remind.schedule_in(60, "c1", "a")
    scheduler.advance(1)
    at = handle.key.scheduled_at.isoformat()
    out = _cli("reschedule", "c1", at, "a", "--in", "300")
    new = TaskKey("c1", START_MS + 301_000, "a")
    assert out.exit_code == 0, out.output
    assert out.output == f"{handle.key}: reschedule requested; its new key is {new}\n"
    scheduler.advance(1)
    shown = _cli("inspect", "c1", at, "a").output
    assert "state:          rescheduled" in shown and f"moved_to:       {new}" in shown
    assert f"reschedule {handle.key} (to {new.scheduled_at.isoformat()})" in shown
    [line] = audit.recent(app)
    assert (line.action, line.target, line.actor) == ("reschedule", str(handle.key), audit.operator())
    refused = _cli("reschedule", "c1", at, "a", "--to", "2030-01-01T00:00:00Z")
    assert refused.exit_code == 1 and "rescheduled already, to" in refused.output
    both = _cli("reschedule", "c1", at, "a", "--in", "5", "--to", "2030-01-01T00:00:00Z")
    assert both.exit_code == 1 and "exactly one of at= and countdown=" in both.output


def test_the_api_moves_a_key_and_refuses_a_released_one(scheduler: SchedulerTesting) -> None:
    http = TestClient(create_app(app))
    handle = remind.schedule_in(60, "c1", "a")
    scheduler.advance(1)
    path = f"/api/v1/tasks/c1/{handle.key.scheduled_at.isoformat()}/a"
    assert http.post(path + "/reschedule", json={"countdown": 30}, headers=READ).status_code == 403
    answer = http.post(path + "/reschedule", json={"countdown": 30}, headers=WRITE)
    assert answer.status_code == 202, answer.text
    body = answer.json()
    assert body["to"]["at"] == (START + dt.timedelta(seconds=31)).isoformat()
    scheduler.advance(1)
    moved = http.get("/api/v1" + body["path"], headers=READ).json()
    assert moved["state"] == "pending" and moved["task_id"] == handle.task_id
    old = http.get(path, headers=READ).json()
    assert old["state"] == "rescheduled" and old["moved_to"] == str(TaskKey("c1", START_MS + 31_000, "a"))
    assert old["operator_actions"] and "reschedule" in old["operator_actions"][0]
    scheduler.advance(40)  # it ran
    again = http.post("/api/v1" + body["path"] + "/reschedule", json={"countdown": 30}, headers=WRITE)
    assert again.status_code == 409 and "succeeded already" in again.json()["message"]
    neither = http.post(path + "/reschedule", json={}, headers=WRITE)
    assert neither.status_code == 422


def test_the_console_moves_a_pending_key_from_its_page(scheduler: SchedulerTesting) -> None:
    http = TestClient(create_app(app))
    handle = remind.schedule_in(60, "c1", "a")
    scheduler.advance(1)
    page = f"/tasks/c1/{handle.key.scheduled_at.isoformat()}/a"
    assert 'id="reschedule"' not in http.get(page + "?token=read-token-0123456789").text
    assert http.post(page + "/reschedule", data={"to": "2030-01-01T00:00:00Z"}).status_code == 403
    assert 'id="reschedule"' in http.get(page + "?token=write-token-0123456789").text
    bad = http.post(page + "/reschedule", data={"to": "soon"})
    assert bad.status_code == 422 and "not an ISO 8601 time" in bad.text
    to = START + dt.timedelta(minutes=10)
    moved = http.post(page + "/reschedule", data={"to": to.isoformat()}, follow_redirects=False)
    assert moved.status_code == 303
    assert moved.headers["location"] == f"/tasks/{segments('c1', to.isoformat(), 'a')}"
    scheduler.advance(1)
    shown = http.get(page).text
    assert "rescheduled" in shown and "<h2>Operators" in shown and "console: reschedule" in shown
    assert 'id="reschedule"' not in shown  # moved: nothing to move any more
    assert [run.key.scheduled_at for run in scheduler.advance(600)] == [to]
