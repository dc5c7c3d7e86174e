"""Bulk cancel against the real Kafka, Cassandra, a dispatcher and a worker: 10,000 pending
keys of one ordering id cancelled from the CLI (its time printed), none of them runs, and the
tasks of another ordering id due at the same time run."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from celery_scheduler.bulk_cancel import Selection, cancel_many
from tests.integration.dispatch_fixtures import Scheduler
from tests.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.cassandra, pytest.mark.redis]
UTC = dt.timezone.utc
MANY = 10_000
KEPT = 20


def test_ten_thousand_keys_of_an_ordering_id_are_cancelled_and_none_runs(
        scheduler: Scheduler, schedule: Callable[..., Any]) -> None:
    scheduler.dispatcher()
    scheduler.worker()
    due = dt.datetime.now(UTC).replace(microsecond=0) + dt.timedelta(seconds=180)
    schedule.record.schedule_many([(due, ("bulk", n)) for n in range(MANY)])
    schedule.record.schedule_many([(due, ("kept", n), {"scheduled_for": due.timestamp()})
                                   for n in range(KEPT)])
    client = schedule.record.client
    # once the dispatcher stored them all
    counted: list[int] = []

    def stored() -> bool:
        counted.append(cancel_many(client, Selection(ordering_id="bulk"), dry_run=True).requested)
        return counted[-1] == MANY

    wait_until(stored, 90, lambda: f"the dispatcher storing the 10,000 keys: found {counted[-5:]}"
               f"\n{scheduler.log_tails(6000)}", every=2.0)
    began = time.monotonic()
    done = scheduler.cli("cancel-many", "--ordering-id", "bulk", "--yes", "--wait", "120", "--json",
                         timeout=200)
    took = time.monotonic() - began
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    print(f"{MANY} keys: cancel-many took {took:.1f}s (with the read-back): {report}")
    assert (report["requested"], report["released"], report["cancelled"], report["unsettled"]) == (
        MANY, 0, MANY, 0), report
    # every cancel applied and read back within 30 s (about 6 s on two cores: the cancels of
    # one ordering id share the dispatcher's rounds)
    assert took <= 30, f"cancel-many of {MANY} keys took {took:.1f}s"
    assert "cancel requested for" in done.stderr  # progress, a page at a time
    again = scheduler.cli("cancel-many", "--ordering-id", "bulk", "--yes", "--json")
    assert json.loads(again.stdout)["requested"] == 0  # found cancelled (or gone): harmless
    # A later key of the cancelled ordering id, not cancelled: it is released only once every
    # key before it in its ordering id is final, so by the time it starts, any cancelled key
    # released by mistake would have started before it.
    schedule.record.schedule_many([(due + dt.timedelta(seconds=1), ("bulk", MANY))])
    wait_until(lambda: sum(s["o"] == "kept" for s in scheduler.starts()) >= KEPT
               and any(s["o"] == "bulk" for s in scheduler.starts()),
               max(0.0, due.timestamp() - time.time()) + 60,
               "the kept ordering id's tasks and the later key of the cancelled one run")
    assert [s["seq"] for s in scheduler.starts() if s["o"] == "bulk"] == [MANY]
