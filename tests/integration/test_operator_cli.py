"""The operator's commands against the real Kafka, Cassandra, a dispatcher and a worker:
``status`` (every partition), ``inspect`` (one key), ``list``, ``retry``, ``dead-letters
list`` and ``replay``."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Producer

from celery_scheduler.envelope import ScheduleEnvelope, encode
from celery_scheduler.keys import TaskKey
from celery_scheduler.partitioner import partition_for
from celery_scheduler.store.base import State
from tests.integration.dispatch_fixtures import Scheduler

pytestmark = [pytest.mark.kafka, pytest.mark.cassandra, pytest.mark.redis]
UTC = dt.timezone.utc
PARTITIONS = 6  # tests.apps.dispatching's default


def _at(key: TaskKey) -> str:
    return key.scheduled_at.isoformat()


def test_status_shows_every_partition_and_inspect_one_key(scheduler: Scheduler,
                                                          schedule: Callable[..., Any]) -> None:
    scheduler.dispatcher()
    later = dt.datetime.now(UTC).replace(microsecond=0) + dt.timedelta(hours=1)
    handle = schedule.record.schedule_at(later, "customer-7", 3, scheduled_for=later.timestamp())
    partition = partition_for("customer-7", PARTITIONS)
    deadline = time.monotonic() + 30
    while True:  # until the dispatcher has stored it
        shown = scheduler.cli("status", "--json")
        assert shown.returncode == 0, shown.stderr
        views = {view["partition"]: view for view in json.loads(shown.stdout)}
        settled = views[partition]["pending"] == 1 and all(v["lag"] == 0 for v in views.values())
        if settled or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert sorted(views) == list(range(PARTITIONS))
    assert views[partition]["pending"] == 1 and views[partition]["oldest"] == later.isoformat()
    assert all(view["leased"] and view["owner"] for view in views.values())  # one dispatcher
    assert all(view["lag"] == 0 for view in views.values())  # it read everything
    table = scheduler.cli("status")
    assert table.returncode == 0 and "partition  owner" in table.stdout
    assert "1 task(s) in the schedule, 6 of 6 partitions leased" in table.stdout

    inspected = scheduler.cli("inspect", "customer-7", _at(handle.key), "seq-3", "--json")
    assert inspected.returncode == 0, inspected.stderr
    described = json.loads(inspected.stdout)
    assert (described["state"], described["task"], described["partition"]) == (
        "pending", "dispatching.record", partition)
    assert described["args"] == '["customer-7", 3]' and described["task_id"] == handle.task_id
    missing = scheduler.cli("inspect", "nobody", _at(handle.key), "seq-3")
    assert missing.returncode == 3 and "unknown" in missing.stdout

    listed = scheduler.cli("list", "--ordering-id", "customer-7", "--json")
    assert listed.returncode == 0, listed.stderr
    [task] = json.loads(listed.stdout)
    assert (task["unique"], task["state"], task["at"]) == ("seq-3", "pending", later.isoformat())


def test_list_finds_failed_and_released_tasks(scheduler: Scheduler,
                                              schedule: Callable[..., Any]) -> None:
    from tests.waiting import wait_for_states

    scheduler.dispatcher()
    scheduler.worker()
    soon = dt.datetime.now(UTC) + dt.timedelta(seconds=1)
    doomed = schedule.flaky.schedule_at(soon, "listed-1", 1, 10)  # fails all 3 attempts
    wait_for_states([doomed], State.FAILED, timeout=60)
    failed = scheduler.cli("list", "--state", "failed", "--json")
    assert failed.returncode == 0, failed.stderr
    [task] = json.loads(failed.stdout)
    assert (task["ordering_id"], task["unique"], task["attempts"]) == ("listed-1", "seq-1", 3)
    assert task["last_error"] == "RuntimeError: planned failure 3 of 10"
    table = scheduler.cli("list", "--state", "released")
    assert table.returncode == 0 and "0 released task(s)" in table.stdout
    both = scheduler.cli("list", "--state", "failed", "--ordering-id", "x")
    assert both.returncode == 2 and "one of --ordering-id and --state" in both.stderr


def test_retry_runs_a_blocked_task_again_and_its_ordering_id_moves_on(
        scheduler: Scheduler, schedule: Callable[..., Any]) -> None:
    from tests.waiting import wait_for_states

    scheduler.env["CELERY_SCHEDULER_TEST_ON_EXHAUSTED"] = "block"
    scheduler.dispatcher()
    scheduler.worker()
    soon = dt.datetime.now(UTC) + dt.timedelta(seconds=1)
    blocking = schedule.flaky.schedule_at(soon, "retry-1", 1, 3)  # fails its 3 attempts, then runs
    after = schedule.record.schedule_at(soon + dt.timedelta(seconds=1), "retry-1", 2)
    wait_for_states([blocking], State.FAILED, timeout=60)
    # The later task is due: it must wait behind the blocked one. A task of another ordering
    # id due after the block: once it ran, the dispatcher has passed the later task's due
    # time with its ordering id blocked (and a release of it would have run first: one
    # worker, taking its queue in order).
    marker = schedule.record.schedule_at(dt.datetime.now(UTC) + dt.timedelta(seconds=1), "marker", 1)
    wait_for_states([marker], State.SUCCEEDED, timeout=30)
    assert [s["seq"] for s in scheduler.starts() if s["o"] == "retry-1"] == [1, 1, 1]
    assert after.status().state is State.PENDING

    refused = scheduler.cli("retry", "retry-1", _at(after.key), "seq-2")
    assert refused.returncode == 1 and "is not failed: it is pending" in refused.stderr
    unknown = scheduler.cli("retry", "nobody", _at(after.key), "seq-2")
    assert unknown.returncode == 1 and "unknown" in unknown.stderr

    retried = scheduler.cli("retry", "retry-1", _at(blocking.key), "seq-1")
    assert retried.returncode == 0 and "retry requested" in retried.stdout, retried.stderr
    wait_for_states([blocking, after], State.SUCCEEDED, timeout=60)
    # one more attempt, then on
    assert [s["seq"] for s in scheduler.starts() if s["o"] == "retry-1"] == [1, 1, 1, 1, 2]
    status = blocking.status()
    assert (status.state, status.attempts) == (State.SUCCEEDED, 4)
    # the worker reported when the last attempt ran; inspect shows it
    assert 0 < status.started_ms <= status.finished_ms <= status.updated_ms
    inspected = json.loads(scheduler.cli("inspect", "retry-1", _at(blocking.key), "seq-1", "--json").stdout)
    assert inspected["started"] and inspected["ended"]
    again = scheduler.cli("retry", "retry-1", _at(blocking.key), "seq-1")
    assert again.returncode == 1 and "succeeded" in again.stderr


def test_a_failed_task_that_was_given_up_is_retried_from_the_api(
        scheduler: Scheduler, schedule: Callable[..., Any]) -> None:
    from fastapi.testclient import TestClient

    from celery_scheduler.web import create_app
    from tests.waiting import wait_for_states

    scheduler.dispatcher()
    scheduler.worker()
    soon = dt.datetime.now(UTC) + dt.timedelta(seconds=1)
    doomed = schedule.flaky.schedule_at(soon, "retry-2", 1, 3)  # skip policy: gives up after 3
    wait_for_states([doomed], State.FAILED, timeout=60)
    client = schedule.record.client
    writer, reader = "write-token-of-the-retry-test", "read-token-of-the-retry-test"
    client.settings = client.settings.replace(api_tokens={writer: "write", reader: "read"})
    http = TestClient(create_app(schedule.app))
    path = f"/api/v1/tasks/retry-2/{_at(doomed.key)}/seq-1/retry"
    assert http.post(path, headers={"Authorization": f"Bearer {reader}"}).status_code == 403
    answer = http.post(path, headers={"Authorization": f"Bearer {writer}"})
    assert answer.status_code == 202, answer.text
    wait_for_states([doomed], State.SUCCEEDED, timeout=60)
    assert [s["seq"] for s in scheduler.starts()] == [1, 1, 1, 1]
    conflict = http.post(path, headers={"Authorization": f"Bearer {writer}"})
    assert conflict.status_code == 409
    assert conflict.json()["error"] == "NotRetryableError" and "succeeded" in conflict.json()["message"]


def test_dead_letters_are_listed_and_replayed_into_the_right_partition(
        scheduler: Scheduler, kafka_bootstrap: str) -> None:
    dispatcher = scheduler.dispatcher("--log-format", "json")
    scheduler.worker()
    topic = scheduler.env["CELERY_SCHEDULER_TEST_TOPIC"]
    due = int(time.time() * 1000) + 2000
    envelope = ScheduleEnvelope(TaskKey("stray", due, "seq-1"), "dispatching.record",
                                args=["stray", 1], kwargs={"scheduled_for": due / 1000})
    right = partition_for("stray", PARTITIONS)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    # a producer that does not use Kafka's Java partitioner: the dispatcher refuses it
    producer.produce(topic, encode(envelope), key=b"stray", partition=(right + 1) % PARTITIONS)
    producer.flush(30)

    deadline = time.monotonic() + 30
    while True:
        listed = scheduler.cli("dead-letters", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        letters = [json.loads(line) for line in listed.stdout.splitlines() if line]
        if letters or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    [letter] = letters
    assert letter["task"] == "dispatching.record" and letter["key"] == "stray"
    assert f"belongs in partition {right}" in letter["reason"]
    assert scheduler.cli("dead-letters", "list", "--reason", "not registered").stdout.startswith(
        "0 dead letter(s)")

    replayed = scheduler.cli("dead-letters", "replay", "--reason", "belongs in partition", "--yes")
    assert replayed.returncode == 0, replayed.stderr
    assert "replayed 1, skipped 0" in replayed.stdout
    scheduler.wait_for_starts(1, timeout=60)
    [run] = scheduler.starts()
    assert (run["o"], run["seq"]) == ("stray", 1)
    # the dispatcher logged JSON lines, the dead letter's among them
    lines = [json.loads(line) for line in scheduler.log_of(dispatcher).splitlines()
             if line.startswith("{")]
    assert any(line["message"].startswith("leased partition") for line in lines)
    assert any("dead-lettering record" in line["message"] for line in lines)
