"""Scheduling through the real Kafka topic and Cassandra schema that `scheduler init` creates."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, TopicPartition

from celery_scheduler.client import SchedulerClient, set_client
from celery_scheduler.config import get_settings
from celery_scheduler.decoding import decode
from celery_scheduler.envelope import ScheduleEnvelope
from celery_scheduler.errors import TaskLogUnavailableError, TopicMissingError
from celery_scheduler.partitioner import partition_for
from tests.services import REPO, drop_scheduler

pytestmark = [pytest.mark.kafka, pytest.mark.cassandra]
UTC = dt.timezone.utc


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.apps.scheduling", "scheduler", *args],
        cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=180,
    )


@pytest.fixture
def names(kafka_bootstrap: str, cassandra_contact: str, unique_name: str,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    env = {"CELERY_SCHEDULER_TEST_TOPIC": unique_name, "CELERY_SCHEDULER_TEST_KEYSPACE": unique_name,
           "CELERY_SCHEDULER_TEST_KAFKA": kafka_bootstrap}
    yield env
    drop_scheduler(unique_name, unique_name)


@pytest.fixture
def app(names: dict[str, str]) -> Iterator[object]:
    from tests.apps.scheduling import app

    settings = get_settings(app).replace(kafka_topic=names["CELERY_SCHEDULER_TEST_TOPIC"],
                                         cassandra_keyspace=names["CELERY_SCHEDULER_TEST_KEYSPACE"])
    client = SchedulerClient(settings)
    previous = set_client(app, client)
    yield app
    client.close()
    set_client(app, previous)


def read_partition(bootstrap: str, topic: str, partition: int, count: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-check",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, partition, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + 30
    try:
        while len(values) < count and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                values.append(message.value())
    finally:
        consumer.close()
    return values


def test_init_is_idempotent_and_creates_topic_and_schema(names: dict[str, str]) -> None:
    first = run_cli("init", env=names)
    assert first.returncode == 0, first.stderr
    assert "created, 6 partitions" in first.stdout
    assert "schema ready" in first.stdout
    second = run_cli("init", env=names)
    assert second.returncode == 0, second.stderr
    assert "exists, 6 partitions" in second.stdout


def test_scheduled_call_lands_in_the_java_partition_and_round_trips(
        names: dict[str, str], app: object, kafka_bootstrap: str) -> None:
    from tests.apps.scheduling import remind

    assert run_cli("init", env=names).returncode == 0
    when = dt.datetime.now(UTC) + dt.timedelta(hours=1)

    handle = remind.schedule_at(when, "customer-42", kind="welcome")

    position = handle.wait()
    assert position.partition == partition_for("customer-42", 6)
    [value] = read_partition(kafka_bootstrap, names["CELERY_SCHEDULER_TEST_TOPIC"], position.partition, 1)
    envelope = decode(value)
    assert envelope == handle.envelope
    assert isinstance(envelope, ScheduleEnvelope)
    assert envelope.kwargs == {"kind": "welcome"}


def test_batched_calls_are_all_acknowledged(names: dict[str, str], app: object) -> None:
    from tests.apps.scheduling import remind

    assert run_cli("init", env=names).returncode == 0
    handles = [remind.schedule((f"c-{i % 7}",), {"kind": str(i)}, countdown=600, wait=False)
               for i in range(500)]
    assert remind.client.flush(30) == 0
    positions = [h.wait(0) for h in handles]
    expected = [partition_for(h.key.ordering_id, 6) for h in handles]
    assert [p.partition for p in positions] == expected


def test_missing_topic_points_at_init(app: object) -> None:
    from tests.apps.scheduling import remind

    with pytest.raises(TopicMissingError, match="scheduler init"):
        remind.schedule_in(60, "c")


def test_unreachable_kafka_fails_within_the_timeout() -> None:
    from tests.apps.scheduling import app, remind

    settings = get_settings(app).replace(kafka_bootstrap_servers="127.0.0.1:1", kafka_produce_timeout=2.0)
    client = SchedulerClient(settings)
    previous = set_client(app, client)
    started = time.monotonic()
    try:
        with pytest.raises(TaskLogUnavailableError, match="did not answer"):
            remind.schedule_in(60, "c")
    finally:
        set_client(app, previous)
        client.close()
    assert time.monotonic() - started < 10


def test_cli_status_and_cancel(names: dict[str, str], app: object) -> None:
    assert run_cli("init", env=names).returncode == 0
    unknown = run_cli("status", "customer-1", "2030-01-01T00:00:00Z", "welcome", env=names)
    assert unknown.returncode == 3 and "unknown" in unknown.stdout
    cancel = run_cli("cancel", "customer-1", "2030-01-01T00:00:00Z", "welcome", env=names)
    assert cancel.returncode == 0 and "cancel requested" in cancel.stdout
    bad = run_cli("status", "customer-1", "next tuesday", "welcome", env=names)
    assert bad.returncode != 0 and "ISO 8601" in bad.stderr
