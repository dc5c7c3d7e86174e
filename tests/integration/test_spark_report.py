"""The report against the real Cassandra, after a dispatcher and a worker ran a known mix."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from celery_scheduler.store.base import State
from tests.integration.dispatch_fixtures import Scheduler
from tests.waiting import wait_for_states

# the Spark modules on one test process, one after the other: one Spark JVM at a time
pytestmark = [pytest.mark.kafka, pytest.mark.cassandra, pytest.mark.redis, pytest.mark.xdist_group("spark"),
              pytest.mark.filterwarnings("ignore::ResourceWarning"),
              pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")]
UTC = dt.timezone.utc


def test_the_report_counts_what_ran_failed_retried_and_waits(
        spark: Any, scheduler: Scheduler, schedule: Callable[..., Any], tmp_path: Path) -> None:
    from celery_scheduler.spark import report

    scheduler.dispatcher()
    scheduler.worker()
    soon = dt.datetime.now(UTC) + dt.timedelta(seconds=2)
    ok = [schedule.record.schedule_at(soon, f"report-{n}", n) for n in range(10)]
    retried = [schedule.flaky.schedule_at(soon, f"retried-{n}", n, 1) for n in range(3)]
    doomed = [schedule.flaky.schedule_at(soon, f"doomed-{n}", n, 10) for n in range(2)]
    waiting = [schedule.record.schedule_at(soon + dt.timedelta(days=1), f"later-{n}", n)
               for n in range(5)]
    wait_for_states(ok + retried, State.SUCCEEDED, timeout=90)
    wait_for_states(doomed, State.FAILED, timeout=90)
    wait_for_states(waiting, State.PENDING, timeout=30)

    settings = schedule.record.client.settings
    made = report(spark, settings, tmp_path / "report", now=soon + dt.timedelta(days=2))

    assert (made.finished, made.succeeded, made.failed, made.retried) == (15, 13, 2, 5)
    assert made.overdue == 5 and made.blocked == 0  # as seen two days later
    assert made.lateness_p50 is not None and 0 < made.lateness_p50 < 30
    # the parts: released within seconds of the time, started after, ran for milliseconds
    assert made.release_p99 is not None and -1 < made.release_p99 < 30
    assert made.wait_p99 is not None and 0 <= made.wait_p99 < 60
    assert made.run_p99 is not None and 0 <= made.run_p99 < 5
    rows = spark.read.parquet(str(tmp_path / "report" / "lateness")).collect()
    for row in rows:
        assert row["scheduled"] <= row["released"] <= row["started"] <= row["ended"] <= row["finished"], row
        assert row["lateness_s"] == pytest.approx(
            row["release_s"] + row["wait_s"] + row["run_s"]
            + (row["finished"] - row["ended"]).total_seconds(), abs=0.01)
    by_task = {row["task"]: row for row in spark.read.parquet(str(tmp_path / "report" / "by_task")).collect()}
    assert (by_task["dispatching.record"]["finished"], by_task["dispatching.record"]["failed"]) == (10, 0)
    flaky = by_task["dispatching.flaky"]
    assert (flaky["finished"], flaky["failed"], flaky["retried"]) == (5, 2, 5)
    assert flaky["failure_rate"] == pytest.approx(0.4)
    errors = {(row["last_error"], row["count"])
              for row in spark.read.parquet(str(tmp_path / "report" / "top_errors")).collect()}
    assert ("RuntimeError: planned failure 3 of 10", 2) in errors
    assert ("RuntimeError: planned failure 1 of 1", 3) in errors
    overdue = spark.read.parquet(str(tmp_path / "report" / "overdue")).collect()
    assert sorted(row["ordering_id"] for row in overdue) == [f"later-{n}" for n in range(5)]
    page = made.html.read_text()
    assert "15 task(s)" in page and page.count("data:image/png;base64,") >= 3
    assert "scheduled to released" in page
    assert "planned failure 3 of 10" in page
