"""``scheduler status`` as a table, run on the testing helper's in-memory dispatcher."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

from click.testing import CliRunner

from celery_scheduler import pauses
from celery_scheduler.cli import scheduler as scheduler_command
from celery_scheduler.partitioner import partition_for
from celery_scheduler.testing import scheduler_testing
from tests.unit.apps import app, remind

START = dt.datetime(2030, 1, 1, 9, 0, tzinfo=dt.timezone.utc)


def status(*options: str) -> str:
    result = CliRunner().invoke(scheduler_command, ["status", *options], obj=SimpleNamespace(app=app))
    assert result.exit_code == 0, result.output
    return result.output


def test_the_table_without_lag_has_no_lag_column() -> None:
    with scheduler_testing(app, partitions=3, start=START) as scheduler:
        remind.schedule_in(60, "c1", kind="welcome")
        scheduler.advance(1)
        lines = status("--no-lag").splitlines()
    assert lines[0].split() == ["partition", "owner", "epoch", "lease", "pending", "oldest", "overdue"]
    assert [line.split()[:5] for line in lines[1:4]] == [
        [str(n), "testing", "1", "held", "1" if n == partition_for("c1", 3) else "0"]
        for n in range(3)]
    assert lines[-1] == "1 task(s) in the schedule, 3 of 3 partitions leased"


def test_what_is_paused_is_said_under_the_table() -> None:
    with scheduler_testing(app, partitions=3, start=START):
        pauses.pause(app, ordering_id="c1")
        pauses.pause(app, task=remind.name)
        lines = status("--no-lag").splitlines()
    assert lines[-1] == (f"paused (2; see `scheduler pauses`): ordering_id 'c1', task '{remind.name}'")
