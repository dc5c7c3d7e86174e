"""Rate limits: a task name's releases across the dispatchers (each its share by the
partitions it holds) and an ordering id's own, at most N a second, by booked slots: a
backlog waits in order, each head booked once; nothing is dropped."""

from __future__ import annotations

import itertools
import json
from types import SimpleNamespace

import pytest
from click.testing import CliRunner, Result
from fastapi.testclient import TestClient

from celery_scheduler import audit, rate_limits
from celery_scheduler.cli import scheduler as scheduler_command
from celery_scheduler.dispatcher.limits import Limiter
from celery_scheduler.dispatcher.timetable import Loaded, Timetable
from celery_scheduler.envelope import ScheduleEnvelope
from celery_scheduler.errors import RateLimitError
from celery_scheduler.keys import TaskKey
from celery_scheduler.store.records import PauseScope, RateLimit
from celery_scheduler.testing import SchedulerTesting
from celery_scheduler.web import create_app
from tests.unit.apps import app, remind

NOW = 1_893_456_000_000


def limited(task: float | None = None, ordering_id: float | None = None) -> list[RateLimit]:
    found = []
    if task is not None:
        found.append(RateLimit(PauseScope.TASK, "t", task, NOW))
    if ordering_id is not None:
        found.append(RateLimit(PauseScope.ORDERING_ID, "o1", ordering_id, NOW))
    return found


def test_slots_are_booked_one_interval_apart_and_no_credit_is_saved() -> None:
    limiter = Limiter()
    limiter.update(limited(task=10))
    assert [limiter.book("t", f"o{n}", NOW) for n in range(4)] == [NOW, NOW + 100, NOW + 200, NOW + 300]
    assert limiter.book("other", "o9", NOW) == NOW  # another name is not limited
    # idle for a while: the next goes when asked, then at the pace again (no burst)
    later = NOW + 10_000
    assert [limiter.book("t", "o1", later), limiter.book("t", "o2", later)] == [later, later + 100]
    assert limiter.delayed == 4


def test_a_dispatcher_takes_its_share_and_an_ordering_id_its_own_pace() -> None:
    limiter = Limiter()
    limiter.update(limited(task=30), share=1 / 3)  # a third of the partitions: 10 a second
    assert limiter.rate_of("t") == pytest.approx(10)
    assert limiter.book("t", "a", NOW) == NOW and limiter.book("t", "b", NOW) == NOW + 100
    limiter.update(limited(ordering_id=2))  # the name's limit lifted: its slots forgotten
    assert limiter.book("t", "a", NOW) == NOW
    assert [limiter.book("x", "o1", NOW), limiter.book("y", "o1", NOW)] == [NOW, NOW + 500]
    limiter.update([])
    assert not limiter and limiter.book("x", "o1", NOW) == NOW


def loaded(ordering_id: str, at: int, task: str = "t") -> Loaded:
    return Loaded(0, ScheduleEnvelope(TaskKey(ordering_id, at, "u"), task))


def test_the_timetable_takes_a_limited_backlog_at_its_slots_booking_each_head_once() -> None:
    table = Timetable()
    table.limiter.update(limited(task=10))
    for n in range(50):
        table.add(loaded(f"o{n:02d}", NOW - 1_000 + n))
    taken = table.take_due(NOW)
    assert [t.key.ordering_id for t in taken] == ["o00"]
    assert table.limiter.delayed == 49  # every other head has its slot, and waits for it
    times = []
    for step in range(1, 60):
        now = NOW + step * 100
        got = table.take_due(now, ahead_ms=50)
        times += [(now, t.key.ordering_id, t.due_ms) for t in got]
    assert [o for _, o, _ in times] == [f"o{n:02d}" for n in range(1, 50)]  # in due order
    assert all(due == NOW + 100 * int(o[1:]) for _, o, due in times)  # each at its slot
    assert table.limiter.delayed == 49  # none booked twice


def test_the_testing_helper_releases_a_limited_task_name_at_its_pace(scheduler: SchedulerTesting) -> None:
    handles = [remind.schedule_in(10, f"c{n}", "a") for n in range(6)]
    rate_limits.limit(app, task=remind.name, per_second=2, by="ops")
    runs = scheduler.advance(10)
    assert len(runs) == 1
    runs += scheduler.advance(1.0) + scheduler.advance(1.5)
    assert [run.at.timestamp() - runs[0].at.timestamp() for run in runs] == [0, 0.5, 1.0, 1.5, 2.0, 2.5]
    assert sorted(run.key for run in runs) == sorted(h.key for h in handles)
    assert [(r.scope.value, r.value, r.per_second, r.by) for r in rate_limits.in_force(app)] == [
        ("task", remind.name, 2.0, "ops")]
    rate_limits.lift(app, task=remind.name)
    assert rate_limits.in_force(app) == []


def test_bad_limits_and_lifts_are_refused_with_the_reason(scheduler: SchedulerTesting) -> None:
    with pytest.raises(RateLimitError, match="exactly one of task and ordering_id, got none"):
        rate_limits.limit(app, per_second=1)
    with pytest.raises(RateLimitError, match="exactly one of task and ordering_id, got task, ordering_id"):
        rate_limits.limit(app, task="a", ordering_id="b", per_second=1)
    for bad in (0, -1, float("nan"), float("inf"), True, "5"):
        with pytest.raises(RateLimitError, match="per_second must be a number above 0"):
            rate_limits.limit(app, task="a", per_second=bad)  # type: ignore[arg-type]
    with pytest.raises(RateLimitError, match=r"task 'a' has no rate limit \(limited: nothing\)"):
        rate_limits.lift(app, task="a")


READ = {"Authorization": "Bearer read-token-0123456789"}
WRITE = {"Authorization": "Bearer write-token-0123456789"}


def _cli(*words: str) -> Result:
    return CliRunner().invoke(scheduler_command, list(words), obj=SimpleNamespace(app=app))


def test_the_cli_sets_lists_and_lifts_a_limit_and_the_log_notes_it(scheduler: SchedulerTesting) -> None:
    out = _cli("rate-limit", "--task", remind.name, "--per-second", "50")
    assert out.exit_code == 0 and out.output.startswith(f"task {remind.name!r} at most 50/s, since ")
    [shown] = json.loads(_cli("rate-limits", "--json").output)
    assert (shown["scope"], shown["value"], shown["per_second"]) == ("task", remind.name, 50.0)
    assert [(a.action, a.target, a.detail) for a in audit.recent(app)] == [
        ("rate-limit", f"task {remind.name!r}", "50/s")]
    assert _cli("rate-limit", "--task", remind.name).exit_code == 2  # neither a rate nor --lift
    bad = _cli("rate-limit", "--task", remind.name, "--per-second", "0")
    assert bad.exit_code == 2 and "per_second must be a number above 0" in bad.output
    lifted = _cli("rate-limit", "--task", remind.name, "--lift")
    assert lifted.exit_code == 0 and "rate limit lifted" in lifted.output
    assert _cli("rate-limits").output == "no rate limit is in force\n"


def test_the_api_and_the_console_set_and_lift_limits(scheduler: SchedulerTesting) -> None:
    http = TestClient(create_app(app))
    body = {"scope": "ordering_id", "value": "c1", "per_second": 0.5}
    assert http.post("/api/v1/rate-limits", json=body, headers=READ).status_code == 403
    answer = http.post("/api/v1/rate-limits", json=body, headers=WRITE)
    assert answer.status_code == 200 and answer.json()["by"].startswith("HTTP API from ")
    assert [r["value"] for r in http.get("/api/v1/rate-limits", headers=READ).json()] == ["c1"]
    missing = http.post("/api/v1/rate-limits", json={"scope": "task", "value": "x"}, headers=WRITE)
    assert missing.status_code == 422 and "per_second" in missing.json()["message"]
    page = http.get("/pauses?token=write-token-0123456789").text
    assert 'id="rate-limits"' in page and "ordering_id &#39;c1&#39;" in page and "0.5/s" in page
    set_ = http.post("/rate-limits/limit", data={"scope": "task", "value": remind.name,
                                                 "per_second": "2"}, follow_redirects=False)
    assert set_.status_code == 303
    bad = http.post("/rate-limits/limit", data={"scope": "task", "value": "x", "per_second": "fast"})
    assert bad.status_code == 422 and "not a number" in bad.text
    assert http.post("/rate-limits/lift", data={"scope": "task", "value": remind.name},
                     follow_redirects=False).status_code == 303
    assert http.post("/api/v1/rate-limits/lift", json={"scope": "ordering_id", "value": "c1"},
                     headers=WRITE).status_code == 200
    assert http.get("/api/v1/rate-limits", headers=READ).json() == []
    again = http.post("/api/v1/rate-limits/lift", json={"scope": "ordering_id", "value": "c1"},
                      headers=WRITE)
    assert again.status_code == 422 and "has no rate limit" in again.json()["message"]


def test_the_engine_reports_its_share_and_what_it_put_off() -> None:
    from prometheus_client import CollectorRegistry

    from celery_scheduler.clock import FakeClock
    from celery_scheduler.dispatcher.engine import Engine, EngineSettings
    from celery_scheduler.metrics import PrometheusMetrics
    from celery_scheduler.store.memory import MemoryScheduleStore

    registry = CollectorRegistry()
    store, clock = MemoryScheduleStore(), FakeClock(NOW)
    released: list[TaskKey] = []
    engine = Engine(store, lambda task, release: released.append(task.key), "d1",
                    EngineSettings(tick_seconds=0), clock=clock, metrics=PrometheusMetrics(registry))
    engine.partition_count = 4
    engine.assign([0])
    store.put_rate_limit(RateLimit(PauseScope.TASK, "t", 40.0, NOW))
    engine.pauses.every_ms = 0
    engine.step()  # leases its partition
    for n in range(3):
        row = store.put(0, ScheduleEnvelope(TaskKey(f"o{n}", NOW, "u"), "t"), NOW)
        assert row is not None
        engine.persisted(row)
    clock.ms += 1
    engine.step()
    # one partition of four held: a quarter of 40 a second, one release each 100 ms
    assert registry.get_sample_value("celery_scheduler_rate_limit_per_second", {"task": "t"}) == 10.0
    assert len(released) == 1
    assert registry.get_sample_value("celery_scheduler_rate_limited_total") == 2
    clock.ms += 250
    engine.step()
    assert len(released) == 3


def test_what_a_resume_lets_go_goes_at_the_limits_pace_in_order(scheduler: SchedulerTesting) -> None:
    from celery_scheduler import pauses

    handles = [remind.schedule_in(10 + n, "c1", f"k{n}") for n in range(3)]
    handles += [remind.schedule_in(10, f"d{n}", "k") for n in range(3)]
    pauses.pause(app, task=remind.name)
    assert scheduler.advance(60) == []
    rate_limits.limit(app, task=remind.name, per_second=1)
    pauses.resume(app, task=remind.name)
    runs = scheduler.advance(0) + scheduler.advance(10)
    assert len(runs) == 6
    gaps = [later.at - earlier.at for earlier, later in itertools.pairwise(runs)]
    assert all(gap.total_seconds() >= 1.0 for gap in gaps), gaps
    assert [run.key.uniqueness_key for run in runs if run.key.ordering_id == "c1"] == ["k0", "k1", "k2"]
