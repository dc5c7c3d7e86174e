"""Pauses: a held head keeps its ordering id waiting in order, a resume releases what fell
due meanwhile, a dispatcher holds everything until it has read the pauses, and an operator
who names nothing, two things, or what is not paused gets a typed error."""

from __future__ import annotations

import datetime as dt
import json
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from celery_scheduler import pauses
from celery_scheduler.cli import scheduler as scheduler_command
from celery_scheduler.clock import FakeClock
from celery_scheduler.dispatcher.engine import Engine, EngineSettings
from celery_scheduler.dispatcher.pausing import EVERYTHING, NOTHING, Held, PauseWatch
from celery_scheduler.dispatcher.timetable import Loaded, Timetable
from celery_scheduler.envelope import ScheduleEnvelope
from celery_scheduler.errors import PauseError
from celery_scheduler.keys import TaskKey
from celery_scheduler.metrics import PrometheusMetrics
from celery_scheduler.store.memory import MemoryScheduleStore
from celery_scheduler.store.records import Pause, PauseScope
from celery_scheduler.testing import SchedulerTesting
from celery_scheduler.web import create_app
from celery_scheduler.wire import Outcome
from tests.unit.apps import app, charge, remind
from tests.unit.fakes import NOW, OutageStore

READ = {"Authorization": "Bearer read-token-0123456789"}
WRITE = {"Authorization": "Bearer write-token-0123456789"}


def loaded(ordering_id: str, at: int, task: str = "t", unique: str = "u") -> Loaded:
    return Loaded(0, ScheduleEnvelope(TaskKey(ordering_id, at, unique), task))


def taken(table: Timetable, now: int) -> list[tuple[str, int]]:
    return [(t.key.ordering_id, t.key.scheduled_ms) for t in table.take_due(now)]


def test_held_is_what_the_pauses_name() -> None:
    held = Held.of([Pause(PauseScope.TASK, "mail", 1), Pause(PauseScope.ORDERING_ID, "c1", 2)])
    assert held.holds("mail", "c9") and held.holds("sms", "c1")
    assert not held.holds("sms", "c9")
    assert held.describe() == "1 task name(s), 1 ordering id(s)"
    assert Held.of([Pause(PauseScope.ALL, "", 1)]) == EVERYTHING
    assert not NOTHING and EVERYTHING.holds("any", "thing")


def test_a_held_head_keeps_its_ordering_id_waiting_and_a_resume_releases_it_in_order() -> None:
    table = Timetable()
    for task in [loaded("c1", 10, "mail", "a"), loaded("c1", 20, "sms", "b"), loaded("c2", 15, "sms")]:
        table.add(task)
    table.hold_by(Held(tasks=frozenset({"mail"})))

    # c1's head is a held task: c1's later task, of another name, waits behind it
    assert taken(table, 100) == [("c2", 15)]
    assert table.held_count() == 1
    assert table.next_take_ms(0) is None  # nothing to wake up for while held
    table.add(loaded("c3", 30, "mail"))
    assert taken(table, 100) == []
    assert table.held_count() == 2

    table.hold_by(NOTHING)
    assert taken(table, 100) == [("c1", 10), ("c3", 30)]
    assert table.held_count() == 0
    table.remove(TaskKey("c1", 10, "a"))
    assert taken(table, 100) == [("c1", 20)]


def test_a_pause_lifted_from_one_ordering_id_leaves_the_others_held() -> None:
    table = Timetable()
    table.add(loaded("c1", 10))
    table.add(loaded("c2", 10))
    table.hold_by(Held(ordering_ids=frozenset({"c1", "c2"})))
    assert taken(table, 100) == []
    table.hold_by(Held(ordering_ids=frozenset({"c2"})))
    assert taken(table, 100) == [("c1", 10)]
    assert table.held_count() == 1
    table.drop_partitions([0])  # revoked: nothing of it is counted held
    assert table.held_count() == 0


def test_a_dispatcher_holds_everything_until_it_has_read_the_pauses() -> None:
    store = OutageStore("pauses")
    watch = PauseWatch(store, every_ms=2000, monotonic=lambda: 0.0)
    assert watch.held == EVERYTHING
    store.down = True
    assert watch.refresh(NOW) is False
    assert watch.held == EVERYTHING  # unread: a restarted dispatcher releases nothing paused
    store.down = False
    assert watch.refresh(NOW + 1000) is False  # not yet time to read again
    assert watch.refresh(NOW + 2000) is True
    assert watch.held == NOTHING
    store.put_pause(Pause(PauseScope.ORDERING_ID, "c1", NOW))
    store.down = True
    assert watch.refresh(NOW + 4000) is False
    assert watch.held == NOTHING  # what was read last holds while the store is away
    store.down = False
    assert watch.refresh(NOW + 6000) is True
    assert watch.held == Held(ordering_ids=frozenset({"c1"}))
    assert watch.refresh(NOW + 8000) is False  # read again, unchanged


def test_the_engine_holds_a_paused_ordering_id_and_counts_it_in_its_metrics() -> None:
    store, clock = MemoryScheduleStore(), FakeClock(NOW)
    released: list[TaskKey] = []
    registry = CollectorRegistry()
    engine = Engine(store, lambda task, release: released.append(task.key), "owner",
                    EngineSettings(tick_seconds=0), clock=clock,
                    metrics=PrometheusMetrics(registry))
    engine.assign([0])
    store.put_pause(Pause(PauseScope.ORDERING_ID, "c1", NOW))
    keys = [TaskKey("c1", NOW + n, "u") for n in (10, 20)] + [TaskKey("c2", NOW + 10, "u")]
    for key in keys:
        stored = store.put(0, ScheduleEnvelope(key, "t"), NOW)
        assert stored is not None
        engine.persisted(stored)
    clock.ms += 100
    engine.step()
    assert released == [keys[2]]
    assert registry.get_sample_value("celery_scheduler_held_ordering_ids") == 1

    store.drop_pause(PauseScope.ORDERING_ID, "c1")
    clock.ms += 1000
    engine.step()
    assert released == [keys[2]]  # read every two seconds, not every step
    clock.ms += 1000
    engine.step()
    assert released == [keys[2], keys[0]]
    assert registry.get_sample_value("celery_scheduler_held_ordering_ids") == 0
    engine.outcome(Outcome(keys[0], 0, 1, True, None))
    engine.step()
    assert released == [keys[2], keys[0], keys[1]]


def test_a_pause_holds_scheduled_tasks_and_a_resume_runs_them_in_order(
        scheduler: SchedulerTesting) -> None:
    first = remind.schedule_in(60, "c1", kind="a")
    second = remind.schedule_in(90, "c1", kind="b")
    other = remind.schedule_in(60, "c2", kind="a")
    paused = pauses.pause(app, ordering_id="c1", reason="incident", by="ops")
    assert (paused.scope, paused.value, paused.by, paused.reason) == (
        PauseScope.ORDERING_ID, "c1", "ops", "incident")
    assert [run.key for run in scheduler.advance(dt.timedelta(minutes=10))] == [other.key]

    assert pauses.resume(app, ordering_id="c1") == paused
    assert [run.key for run in scheduler.advance(1)] == [first.key, second.key]


def test_a_task_name_and_everything_can_be_paused(scheduler: SchedulerTesting) -> None:
    reminder = remind.schedule_in(60, "c1", kind="a")
    payment = charge.schedule_in(60, "c2", amount=5)
    pauses.pause(app, task=remind.name)
    assert [run.key for run in scheduler.advance(120)] == [payment.key]
    pauses.pause(app, everything=True)
    pauses.resume(app, task=remind.name)
    assert scheduler.advance(120) == []  # everything still paused
    assert [p.scope for p in pauses.in_force(app)] == [PauseScope.ALL]
    pauses.resume(app, everything=True)
    assert [run.key for run in scheduler.advance(1)] == [reminder.key]


def test_pausing_twice_keeps_the_first_time(scheduler: SchedulerTesting) -> None:
    first = pauses.pause(app, ordering_id="c1")
    scheduler.advance(30)
    again = pauses.pause(app, ordering_id="c1", reason="still")
    assert again.paused_ms == first.paused_ms and again.reason == "still"
    assert len(pauses.in_force(app)) == 1


@pytest.mark.parametrize(("named", "message"), [
    ({}, "name exactly one of task, ordering_id and everything, got none"),
    ({"task": "t", "ordering_id": "c1"}, "got task, ordering_id"),
    ({"ordering_id": " "}, "must be a non-empty string, got ' '"),
    ({"task": 7}, "must be a non-empty string, got 7"),
])
def test_a_pause_must_name_one_thing(scheduler: SchedulerTesting, named: dict[str, object],
                                     message: str) -> None:
    with pytest.raises(PauseError, match=message):
        pauses.pause(app, **named)  # type: ignore[arg-type]
    assert pauses.in_force(app) == []


def test_resuming_what_is_not_paused_names_what_is(scheduler: SchedulerTesting) -> None:
    pauses.pause(app, task=remind.name)
    with pytest.raises(PauseError, match=r"ordering_id 'c1' is not paused \(paused: task "):
        pauses.resume(app, ordering_id="c1")
    with pytest.raises(PauseError, match=r"everything is not paused"):
        pauses.resume(app, everything=True)


def test_the_cli_pauses_lists_and_resumes(scheduler: SchedulerTesting) -> None:
    runner = CliRunner()
    paused = runner.invoke(scheduler_command, ["pause", "--ordering-id", "c1", "--reason", "incident"],
                           obj=SimpleNamespace(app=app))
    assert paused.exit_code == 0, paused.output
    assert paused.output.startswith("ordering_id 'c1' paused since ") and paused.output.rstrip().endswith(
        ": incident")
    listed = runner.invoke(scheduler_command, ["pauses", "--json"], obj=SimpleNamespace(app=app))
    [shown] = json.loads(listed.output)
    assert (shown["scope"], shown["value"], shown["reason"]) == ("ordering_id", "c1", "incident")
    refused = runner.invoke(scheduler_command, ["pause", "--task", "t", "--all"],
                            obj=SimpleNamespace(app=app))
    assert refused.exit_code == 1 and "got task, all" in refused.output
    resumed = runner.invoke(scheduler_command, ["resume", "--ordering-id", "c1"],
                            obj=SimpleNamespace(app=app))
    assert resumed.exit_code == 0 and resumed.output == "ordering_id 'c1' resumed\n"
    again = runner.invoke(scheduler_command, ["resume", "--ordering-id", "c1"],
                          obj=SimpleNamespace(app=app))
    assert again.exit_code == 1 and "is not paused (paused: nothing)" in again.output
    assert runner.invoke(scheduler_command, ["pauses"], obj=SimpleNamespace(app=app)
                         ).output == "nothing is paused\n"


def test_the_http_api_and_the_console_pause_and_resume(scheduler: SchedulerTesting) -> None:
    http = TestClient(create_app(app))
    call = {"scope": "task", "value": remind.name, "reason": "mail is down"}
    assert http.post("/api/v1/pauses", json=call, headers=READ).status_code == 403
    made = http.post("/api/v1/pauses", json=call, headers=WRITE)
    assert made.status_code == 200, made.text
    assert made.json()["by"].startswith("HTTP API from ")
    listed = http.get("/api/v1/pauses", headers=READ).json()
    assert [(p["scope"], p["value"]) for p in listed] == [("task", remind.name)]
    wrong = http.post("/api/v1/pauses", json={"scope": "all", "value": "x"}, headers=WRITE)
    assert wrong.status_code == 422 and wrong.json()["error"] == "PauseError"
    missing = http.post("/api/v1/pauses/resume", json={"scope": "ordering_id", "value": "c9"},
                        headers=WRITE)
    assert missing.status_code == 422 and "is not paused" in missing.json()["message"]

    page = http.get("/pauses?token=read-token-0123456789")
    assert page.status_code == 200 and "mail is down" in page.text and "Resume" not in page.text
    assert http.post("/pauses/pause", content="scope=ordering_id&value=c1").status_code == 403
    page = http.get("/pauses?token=write-token-0123456789")
    assert "<button>Resume</button>" in page.text
    done = http.post("/pauses/pause", content="scope=ordering_id&value=c%2F1&reason=why",
                     headers={"Content-Type": "application/x-www-form-urlencoded"},
                     follow_redirects=False)
    assert done.status_code == 303
    assert {(p.scope.value, p.value, p.by) for p in pauses.in_force(app)} == {
        ("task", remind.name, made.json()["by"]), ("ordering_id", "c/1", "console")}
    assert http.post("/pauses/resume", content="scope=task&value=" + remind.name,
                     follow_redirects=False).status_code == 303
    refused = http.post("/pauses/resume", content="scope=task&value=" + remind.name)
    assert refused.status_code == 422 and "is not paused" in refused.text
    assert http.post("/pauses/pause", content="scope=planet&value=x").status_code == 422
    assert [p.value for p in pauses.in_force(app)] == ["c/1"]
