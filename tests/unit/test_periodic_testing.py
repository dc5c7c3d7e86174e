"""beat_schedule entries in the testing helper: fired as a dispatcher fires them, each
occurrence once, on the fake clock; an entry the dispatchers could not run is refused."""

from __future__ import annotations

import datetime as dt
import functools
import json
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from celery.schedules import crontab
from click.testing import CliRunner
from fastapi.testclient import TestClient

from celery_scheduler import periodic_admin, periodic_tasks
from celery_scheduler.cli import scheduler as scheduler_command
from celery_scheduler.errors import PeriodicEntryError
from celery_scheduler.periodic_entries import entry_of
from celery_scheduler.testing import scheduler_testing
from celery_scheduler.web import create_app

UTC = dt.timezone.utc
START = dt.datetime(2030, 1, 1, 9, 0, 30, tzinfo=UTC)


def periodic_app(name: str, beat_schedule: dict[str, Any], install: bool = True) -> Celery:
    app = Celery(name, broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.scheduler_periodic = True
    app.conf.beat_schedule = beat_schedule

    @app.task(name=f"{name}.report")
    def report(kind: str) -> str:
        return kind

    @app.task(name=f"{name}.sweep")
    def sweep() -> None:
        pass

    if install:
        periodic_tasks.install(app)
    app.finalize()
    return app


def test_an_interval_entry_fires_at_each_multiple_once_and_a_crontab_at_its_times() -> None:
    app = periodic_app("fires", {
        "minutely": {"task": "fires.report", "schedule": 60, "args": ["minute"]},
        "quarterly": {"task": "fires.report", "schedule": crontab(minute="*/15"),
                      "kwargs": {"kind": "quarter"}},
    })
    with scheduler_testing(app, start=START) as scheduler:
        runs = scheduler.advance(dt.timedelta(minutes=31))
        fired = [(run.envelope.key.ordering_id, run.at, run.result.get()) for run in runs]
        minutes = [at for ordering_id, at, _ in fired if ordering_id == "periodic:minutely"]
        assert minutes == [dt.datetime(2030, 1, 1, 9, m, tzinfo=UTC) for m in range(1, 32)]
        quarters = [(at, result) for ordering_id, at, result in fired
                    if ordering_id == "periodic:quarterly"]
        assert quarters == [(dt.datetime(2030, 1, 1, 9, m, tzinfo=UTC), "quarter") for m in (15, 30)]
        assert all(result == "minute" for o, _, result in fired if o == "periodic:minutely")
        assert len({run.key for run in runs}) == len(runs)  # each occurrence once
        assert scheduler.advance(0) == []


def test_an_entry_whose_task_is_not_a_scheduled_task_is_refused_by_name() -> None:
    app = periodic_app("plain", {"sweep": {"task": "plain.sweep", "schedule": 60}},
                          install=False)
    with pytest.raises(PeriodicEntryError, match=r"'sweep'.*periodic_tasks\.install"), \
            scheduler_testing(app, start=START):
        pass


def test_a_malformed_entry_is_refused_before_anything_fires() -> None:
    app = periodic_app("bad", {"nightly": {"task": "bad.report", "schedule": "daily"}},
                          install=False)
    with pytest.raises(PeriodicEntryError, match=r"'nightly'.*schedule must be"), \
            scheduler_testing(app, start=START):
        pass


def cli(app: Celery, *arguments: str) -> str:
    result = CliRunner().invoke(scheduler_command, ["periodic", *arguments],
                                obj=SimpleNamespace(app=app))
    assert result.exit_code == 0, result.output
    return result.output


def test_the_cli_lists_entries_with_what_they_fired_and_backfills_each_occurrence_once() -> None:
    app = periodic_app("cli", {"minutely": {"task": "cli.report", "schedule": 60, "args": ["m"]}})
    with scheduler_testing(app, start=START) as scheduler:
        scheduler.advance(dt.timedelta(minutes=3))
        [listed] = [json.loads(line) for line in cli(app, "list", "--json").splitlines()]
        assert (listed["name"], listed["task"], listed["scheduled_task"]) == ("minutely", "cli.report", True)
        assert listed["last_fired"] == "2030-01-01T09:03:00+00:00" and len(listed["next"]) == 3
        said = cli(app, "backfill", "minutely", "2030-01-01T08:00:00Z", "2030-01-01T08:05:00Z")
        assert "scheduled 6 occurrence(s)" in said
        runs = scheduler.advance(0)
        assert [run.envelope.key.scheduled_at for run in runs] == [
            dt.datetime(2030, 1, 1, 8, m, tzinfo=UTC) for m in range(6)]
        # the same span again, and the occurrences the dispatcher fired: each ran already
        cli(app, "backfill", "minutely", "2030-01-01T08:00:00Z", "2030-01-01T08:05:00Z")
        cli(app, "backfill", "minutely", "2030-01-01T09:01:00Z", "2030-01-01T09:03:00Z")
        assert scheduler.advance(0) == []
        assert "scheduled" in cli(app, "trigger", "minutely")
        [triggered] = scheduler.advance(0)
        assert triggered.key.uniqueness_key.startswith("trigger-")
        assert triggered.key.ordering_id == "periodic:minutely"


def test_the_cli_refuses_an_unknown_entry_and_a_time_without_an_offset() -> None:
    app = periodic_app("refuse", {"minutely": {"task": "refuse.report", "schedule": 60}})
    with scheduler_testing(app, start=START):
        result = CliRunner().invoke(scheduler_command, ["periodic", "trigger", "hourly"],
                                    obj=SimpleNamespace(app=app))
        assert result.exit_code == 2 and "no periodic entry 'hourly'" in result.output
        result = CliRunner().invoke(scheduler_command, ["periodic", "backfill", "minutely",
                                                        "2030-01-01T08:00", "2030-01-01T09:00Z"],
                                    obj=SimpleNamespace(app=app))
        assert result.exit_code == 2 and "no UTC offset" in result.output


def test_entries_added_with_add_periodic_task_fire_too() -> None:
    app = Celery("added", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.scheduler_periodic = True

    @app.task(name="added.ping")
    def ping(word: str) -> str:
        return word

    @app.on_after_configure.connect
    def add_entries(sender: Celery, **_: Any) -> None:
        sender.add_periodic_task(30.0, ping.s("pong"), name="ping every 30 s")

    periodic_tasks.install(app)
    app.finalize()
    with scheduler_testing(app, start=START) as scheduler:
        runs = scheduler.advance(60)
    assert [(run.envelope.key.ordering_id, run.at, run.result.get()) for run in runs] == [
        ("periodic:ping every 30 s", dt.datetime(2030, 1, 1, 9, m, s, tzinfo=UTC), "pong")
        for m, s in ((1, 0), (1, 30))]


READ = {"Authorization": "Bearer read-token-0123456789"}


def test_the_http_api_and_the_console_show_each_entry_its_last_run_and_the_next_ones() -> None:
    app = periodic_app("web", {
        "minutely": {"task": "web.report", "schedule": 60, "args": ["m"]},
        "<b>sweep</b>": {"task": "web.sweep", "schedule": crontab(minute="*/15")},
    })
    app.conf.scheduler_api_tokens = {"read-token-0123456789": "read"}
    with scheduler_testing(app, start=START) as scheduler:
        scheduler.advance(dt.timedelta(minutes=3))
        http = TestClient(create_app(app))
        assert http.get("/api/v1/periodic").status_code == 401
        listed = {entry["name"]: entry for entry in http.get("/api/v1/periodic", headers=READ).json()}
        minutely = listed["minutely"]
        assert (minutely["task"], minutely["last_fired"], minutely["last_state"]) == (
            "web.report", "2030-01-01T09:03:00Z", "succeeded")
        assert minutely["next"] == ["2030-01-01T09:04:00Z", "2030-01-01T09:05:00Z",
                                    "2030-01-01T09:06:00Z"]
        assert listed["<b>sweep</b>"]["last_fired"] is None  # 9:15 has not come
        page = http.get("/periodic", params={"token": "read-token-0123456789"})
        assert page.status_code == 200
        assert "&lt;b&gt;sweep&lt;/b&gt;" in page.text and "<b>sweep</b>" not in page.text
        assert "2030-01-01T09:03:00+00:00" in page.text and "succeeded" in page.text


def run_times(runs: list[Any], name: str) -> list[dt.datetime]:
    return [run.at for run in runs if run.envelope.key.ordering_id == f"periodic:{name}"]


def at(minute: int, second: int = 0) -> dt.datetime:
    return dt.datetime(2030, 1, 1, 9, minute, second, tzinfo=UTC)


def test_a_paused_entry_fires_nothing_and_resumed_goes_on_from_its_next_occurrence() -> None:
    app = periodic_app("pause", {"minutely": {"task": "pause.report", "schedule": 60, "args": ["m"]},
                                 "other": {"task": "pause.sweep", "schedule": 60}})
    with scheduler_testing(app, start=START) as scheduler:
        assert run_times(scheduler.advance(60), "minutely") == [at(1)]
        periodic_admin.pause(app, "minutely")
        runs = scheduler.advance(dt.timedelta(minutes=3))
        assert run_times(runs, "minutely") == []  # 9:02-9:04 skipped while paused
        assert run_times(runs, "other") == [at(2), at(3), at(4)]  # the others go on
        periodic_admin.resume(app, "minutely")
        assert run_times(scheduler.advance(dt.timedelta(minutes=2)), "minutely") == [at(5), at(6)]


def test_an_entry_deleted_at_run_time_never_fires_and_one_added_fires_until_reset() -> None:
    app = periodic_app("admin", {"minutely": {"task": "admin.report", "schedule": 60, "args": ["m"]}})
    with scheduler_testing(app, start=START) as scheduler:
        periodic_admin.delete(app, "minutely")
        periodic_admin.add(app, "half", {"task": "admin.report", "schedule": 30, "args": ["h"]})
        runs = scheduler.advance(dt.timedelta(minutes=2))
        assert run_times(runs, "minutely") == []
        assert run_times(runs, "half") == [at(1), at(1, 30), at(2), at(2, 30)]
        assert {run.result.get() for run in runs} == {"h"}
        periodic_admin.reset(app, "half")  # added at run time only: gone
        assert run_times(scheduler.advance(dt.timedelta(minutes=2)), "half") == []
        assert set(periodic_admin.changes(app)) == {"minutely"}


def test_a_definition_replaced_at_run_time_fires_by_the_new_one() -> None:
    app = periodic_app("replace", {"tick": {"task": "replace.report", "schedule": 60, "args": ["m"]}})
    with scheduler_testing(app, start=START) as scheduler:
        assert run_times(scheduler.advance(60), "tick") == [at(1)]
        periodic_admin.add(app, "tick", {"task": "replace.report", "schedule": crontab(minute="*/2"),
                                         "args": ["every two"]})
        runs = scheduler.advance(dt.timedelta(minutes=4))
        assert run_times(runs, "tick") == [at(2), at(4)]
        assert {run.result.get() for run in runs} == {"every two"}


def test_changes_that_cannot_be_run_are_refused_and_change_nothing() -> None:
    app = periodic_app("refused", {"tick": {"task": "refused.report", "schedule": 60}})

    @app.task(name="refused.plain")
    def plain() -> None:
        pass

    with scheduler_testing(app, start=START):
        with pytest.raises(PeriodicEntryError, match=r"'nothing'.*no such entry"):
            periodic_admin.pause(app, "nothing")
        with pytest.raises(PeriodicEntryError, match="not a scheduled task"):
            periodic_admin.add(app, "new", {"task": "refused.plain", "schedule": 60})
        with pytest.raises(PeriodicEntryError, match=r"'new'.*schedule must be"):
            periodic_admin.add(app, "new", {"task": "refused.report", "schedule": "hourly"})
        assert periodic_admin.changes(app) == {}


WRITE = {"Authorization": "Bearer write-token-0123456789"}


def test_entries_change_at_run_time_through_the_http_api_the_console_and_the_cli() -> None:
    app = periodic_app("ops", {"minutely": {"task": "ops.report", "schedule": 60, "args": ["m"]}})
    app.conf.scheduler_api_tokens = {"read-token-0123456789": "read",
                                     "write-token-0123456789": "write"}
    with scheduler_testing(app, start=START) as scheduler:
        http = TestClient(create_app(app))
        new = {"task": "ops.report", "crontab": "*/15 * * * *", "args": ["q"]}
        assert http.put("/api/v1/periodic/quarter", json=new, headers=READ).status_code == 403
        assert http.put("/api/v1/periodic/quarter", json=new, headers=WRITE).status_code == 204
        assert http.post("/api/v1/periodic/minutely/pause", headers=WRITE).status_code == 204
        refused = http.post("/api/v1/periodic/nothing/pause", headers=WRITE)
        assert refused.status_code == 422 and "no such entry" in refused.json()["message"]
        listed = {e["name"]: e for e in http.get("/api/v1/periodic", headers=READ).json()}
        assert (listed["quarter"]["source"], listed["quarter"]["state"]) == ("run time", "active")
        assert (listed["minutely"]["state"], listed["minutely"]["next"]) == ("paused", [])
        runs = scheduler.advance(dt.timedelta(minutes=16))
        assert run_times(runs, "minutely") == [] and run_times(runs, "quarter") == [at(15)]
        # the console: a write token shows the buttons, and Resume works
        page = http.get("/periodic", params={"token": "write-token-0123456789"})
        assert 'action="/periodic/minutely/resume"' in page.text
        resumed = http.post("/periodic/minutely/resume", follow_redirects=False)
        assert resumed.status_code == 303
        assert run_times(scheduler.advance(60), "minutely") == [at(17)]
        # the CLI
        assert "deleted" in cli(app, "delete", "minutely")
        assert run_times(scheduler.advance(120), "minutely") == []
        assert "as beat_schedule says" in cli(app, "reset", "minutely")
        assert run_times(scheduler.advance(0), "minutely") == []  # nothing deleted catches up
        assert "added" in cli(app, "add", "half", "--task", "ops.report", "--every", "30",
                              "--args", '["h"]')
        runs = scheduler.advance(60)
        assert run_times(runs, "half") == [at(20), at(20, 30)]
        # a solar event, through the API and the CLI (Paris's sunrise on 2 January 2030)
        sunrise = {"task": "ops.report", "solar": "sunrise 48.85 2.35", "args": ["s"]}
        assert http.put("/api/v1/periodic/dawn", json=sunrise, headers=WRITE).status_code == 204
        assert "added" in cli(app, "add", "dusk", "--task", "ops.report", "--solar",
                              "sunset 48.85 2.35", "--args", '["d"]')
        runs = scheduler.advance(dt.timedelta(days=1))
        [dawn] = run_times(runs, "dawn")
        assert dawn.isoformat().startswith("2030-01-02T07:4")  # 07:44 UTC
        [dusk] = run_times(runs, "dusk")
        assert dusk.isoformat().startswith("2030-01-01T16:0")  # 16:06 UTC


@functools.cache
def typed_app() -> Celery:
    app = periodic_app("typed", {})  # one for every case: task names are registered once
    app.conf.scheduler_api_tokens = {"write-token-0123456789": "write"}
    return app


@pytest.mark.parametrize(("given", "problem"), [
    ({}, "give exactly one of every, crontab and solar, got none"),
    ({"every": 60, "crontab": "* * * * *"}, "got every, crontab"),
    ({"crontab": "*/5 * *"}, "is not five fields"),
    ({"crontab": "61 * * * *"}, "crontab '61 * * * *'"),
    ({"solar": "sunrise"}, "is not EVENT LATITUDE LONGITUDE"),
    ({"solar": "sunrise north 2.35"}, "is not EVENT LATITUDE LONGITUDE"),
    ({"solar": "sunrise 48.85 2.35 0"}, "is not EVENT LATITUDE LONGITUDE"),
    ({"solar": "moonrise 48.85 2.35"}, "moonrise"),
    ({"solar": "sunrise 91 2.35"}, "91"),
])
def test_a_schedule_typed_by_an_operator_is_refused_naming_what_is_wrong(
        given: dict[str, Any], problem: str) -> None:
    with pytest.raises(PeriodicEntryError, match="'entry'") as raised:
        periodic_admin.schedule_from_text("entry", **given)
    assert problem in str(raised.value)
    app = typed_app()
    with scheduler_testing(app, start=START):
        refused = TestClient(create_app(app)).put(
            "/api/v1/periodic/entry", json={"task": "typed.report", **given},
            headers={"Authorization": "Bearer write-token-0123456789"})
        assert refused.status_code == 422 and problem in refused.json()["message"]


@pytest.mark.parametrize("overlap", ["buffer_all", "buffer_one", "skip", "allow_all"])
def test_an_occurrence_whose_run_before_waits_for_a_retry_runs_after_it_or_is_skipped(
        overlap: str) -> None:
    app = Celery(f"overlap_{overlap}", broker="memory://", backend="cache+memory://",
                 set_as_current=False)
    app.conf.update(scheduler_periodic=True, scheduler_retry_backoff=30.0, scheduler_max_attempts=2,
                    beat_schedule={"job": {"task": f"{overlap}.job", "schedule": 10, "overlap": overlap}})
    failures = [1]

    @app.task(name=f"{overlap}.job")
    def job() -> None:
        if failures:
            failures.pop()
            raise RuntimeError("the first run fails")

    periodic_tasks.install(app)
    app.finalize()
    with scheduler_testing(app, start=START) as scheduler:
        runs = scheduler.advance(dt.timedelta(seconds=80))  # to 9:01:50
    ran = {f"{run.envelope.key.scheduled_at:%-H:%M:%S}" for run in runs}
    # 9:00:40 fails and is retried 15-30 s later, by 9:01:10; at 9:00:50 it is waiting for that
    assert {"9:00:40", "9:01:20", "9:01:30", "9:01:40", "9:01:50"} <= ran
    assert ("9:00:50" in ran) is (overlap in ("buffer_all", "allow_all"))
    order = [f"{run.envelope.key.scheduled_at:%-H:%M:%S}" for run in runs]
    retried = len(order) - 1 - order[::-1].index("9:00:40")  # the second run of 9:00:40
    if overlap == "allow_all":  # at its time, beside the retry: not after it
        assert order.index("9:00:50") < retried
    elif overlap == "buffer_all":
        assert order.index("9:00:50") > retried


def test_an_entry_starts_and_ends_when_it_says_or_after_its_count() -> None:
    app = periodic_app("bounded", {
        "window": {"task": "bounded.report", "schedule": 60, "args": ["w"],
                   "start": "2030-01-01T09:03:00Z", "until": dt.datetime(2030, 1, 1, 9, 5, tzinfo=UTC)},
        "thrice": {"task": "bounded.report", "schedule": crontab(minute="*/2"), "args": ["t"],
                   "start": "2030-01-01T09:01:00+00:00", "count": 3},
    })
    with scheduler_testing(app, start=START) as scheduler:
        runs = scheduler.advance(dt.timedelta(minutes=15))
        assert run_times(runs, "window") == [at(3), at(4), at(5)]
        assert run_times(runs, "thrice") == [at(2), at(4), at(6)]
        [listed] = [json.loads(line) for line in cli(app, "list", "--json").splitlines()
                    if json.loads(line)["name"] == "thrice"]
        assert listed["next"] == []  # over


def test_a_count_without_a_start_and_a_time_without_an_offset_are_refused() -> None:
    with pytest.raises(PeriodicEntryError, match=r"'count' needs 'start'"):
        entry_of("n", {"task": "t", "schedule": 60, "count": 3})
    with pytest.raises(PeriodicEntryError, match=r"'until' must be an aware datetime"):
        entry_of("n", {"task": "t", "schedule": 60, "until": dt.datetime(2030, 1, 1)})
    with pytest.raises(PeriodicEntryError, match=r"'start' is not an ISO 8601 time"):
        entry_of("n", {"task": "t", "schedule": 60, "start": "tomorrow"})
