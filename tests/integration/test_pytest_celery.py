"""The package's ``celery_scheduler_dispatcher`` fixture beside Celery's own pytest fixtures
(``celery.contrib.pytest``): a real dispatcher in a thread releases to the app's broker, and
the embedded ``celery_worker`` runs each task and reports its outcome, in one process, on
real Kafka, Cassandra and Redis. It is how a user's own integration tests can look."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from celery_scheduler import State, scheduled_task
from celery_scheduler.config import get_settings
from celery_scheduler.environment import drop
from tests.waiting import wait_until

pytest_plugins = ["celery.contrib.pytest"]
pytestmark = [pytest.mark.kafka, pytest.mark.cassandra, pytest.mark.redis]


def scheduler_config(unique_name: str, broker_url: str, kafka_bootstrap: str,
                     cassandra_contact: str) -> dict[str, Any]:
    """A test app's settings on the test's own queue, topic and keyspace."""
    host, port = cassandra_contact.rsplit(":", 1)
    return {"broker_url": broker_url, "task_default_queue": unique_name,
            "scheduler_kafka_bootstrap_servers": kafka_bootstrap,
            "scheduler_kafka_topic": unique_name, "scheduler_kafka_partitions": 3,
            "scheduler_cassandra_contact_points": [host], "scheduler_cassandra_port": int(port),
            "scheduler_cassandra_keyspace": unique_name}


@pytest.fixture
def celery_config(unique_name: str, broker_url: str, kafka_bootstrap: str,
                  cassandra_contact: str) -> Mapping[str, Any]:
    """Celery's fixture for the test app's settings: the scheduler's are Celery settings."""
    return scheduler_config(unique_name, broker_url, kafka_bootstrap, cassandra_contact)


@pytest.fixture
def remind(celery_app: Any) -> Iterator[tuple[Any, list[tuple[str, int]]]]:
    """The app's scheduled task, defined before the dispatcher starts, and what it ran; the
    test's topics and keyspace are dropped after it (and after the dispatcher stopped)."""
    ran: list[tuple[str, int]] = []

    @scheduled_task(ordering_id="customer")
    @celery_app.task(name="pytest_celery.remind")
    def remind(customer: str, step: int) -> int:
        ran.append((customer, step))
        return step

    yield remind, ran
    drop(get_settings(celery_app))


def test_a_real_dispatcher_releases_to_celerys_embedded_worker_in_order(
        remind: tuple[Any, list[tuple[str, int]]], celery_worker: Any,
        celery_scheduler_dispatcher: Any) -> None:
    task, runs = remind
    due = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=2)
    handles = [task.schedule_at(due + dt.timedelta(milliseconds=10 * step), customer, step)
               for step in range(5) for customer in ("ada", "bob")]

    wait_until(lambda: len(runs) >= len(handles), 60, lambda: runs)
    assert sorted(runs) == sorted((c, s) for s in range(5) for c in ("ada", "bob"))
    for customer in ("ada", "bob"):  # in order per ordering id
        assert [step for who, step in runs if who == customer] == list(range(5))
    # the worker's outcomes reached the dispatcher, which stored them
    wait_until(lambda: all(getattr(h.status(), "state", None) is State.SUCCEEDED for h in handles),
               30, lambda: [h.status() for h in handles])
