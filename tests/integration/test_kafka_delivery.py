"""Delayed Kafka messages against the real Kafka, Cassandra and a dispatcher: produced to
the target topic in order per ordering id, never when cancelled, again (never zero times)
when the dispatcher dies between Kafka's acknowledgement and recording it, and failed with
the topic's name after the last attempt when the topic does not exist."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from celery_scheduler import schedule_message
from celery_scheduler.messages import KEY_HEADER
from celery_scheduler.store.base import State
from tests.integration.dispatch_fixtures import Scheduler
from tests.waiting import wait_for_states

pytestmark = [pytest.mark.kafka, pytest.mark.cassandra, pytest.mark.redis]
UTC = dt.timezone.utc


@pytest.fixture
def target(kafka_bootstrap: str, unique_name: str) -> Iterator[str]:
    """A topic of its own to deliver to (the broker does not create topics on demand)."""
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    name = f"{unique_name}_target"
    admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)])[name].result(30)
    yield name
    admin.delete_topics([name])[name].result(30)


def read_all(kafka: str, topic: str, expected: int, timeout: float = 60) -> list[Any]:
    """The messages of *topic* once it holds *expected* (and a second more for extras)."""
    consumer = Consumer({"bootstrap.servers": kafka, "group.id": f"{topic}-reader",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    found: list[Any] = []
    deadline = time.monotonic() + timeout
    extra_until = None
    try:
        while time.monotonic() < (extra_until or deadline):
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                found.append(message)
            if len(found) >= expected and extra_until is None:
                extra_until = time.monotonic() + 1.0
    finally:
        consumer.close()
    return found


def test_messages_are_produced_in_order_per_ordering_id_and_never_when_cancelled(
        scheduler: Scheduler, schedule: Callable[..., Any], target: str, kafka_bootstrap: str) -> None:
    scheduler.dispatcher()
    app = schedule.app
    soon = dt.datetime.now(UTC) + dt.timedelta(seconds=3)
    handles = [schedule_message(target, f"m{n}".encode(), key=b"acct-1", headers={"n": str(n)},
                                at=soon + dt.timedelta(milliseconds=10 * n), ordering_id="acct-1",
                                app=app) for n in range(5)]
    dropped = schedule_message(target, b"never", at=soon + dt.timedelta(seconds=1),
                               ordering_id="acct-2", app=app)
    dropped.cancel()
    wait_for_states(handles, State.SUCCEEDED, timeout=60)
    messages = read_all(kafka_bootstrap, target, 5)
    assert [m.value() for m in messages] == [f"m{n}".encode() for n in range(5)]
    assert all(m.key() == b"acct-1" for m in messages)
    first = dict(messages[0].headers())
    assert first["n"] == b"0" and first[KEY_HEADER] == str(handles[0].key).encode()
    status = dropped.status()
    assert status is not None and status.state is State.CANCELLED
    times = [m.timestamp()[1] for m in messages]
    assert times[0] >= int(soon.timestamp() * 1000)  # not before its time


def test_a_dispatcher_dying_on_the_acknowledgement_produces_the_message_again(
        scheduler: Scheduler, schedule: Callable[..., Any], target: str, kafka_bootstrap: str) -> None:
    dying = scheduler.dispatcher(extra_env={"CELERY_SCHEDULER_TEST_DIE_ON_DELIVERY": "1"})
    handle = schedule_message(target, b"at least once", countdown=2, ordering_id="acct-3",
                              app=schedule.app)
    assert dying.wait(timeout=60) == 9  # died on Kafka's acknowledgement
    scheduler.dispatcher()
    wait_for_states([handle], State.SUCCEEDED, timeout=60)
    messages = read_all(kafka_bootstrap, target, 2)
    assert [m.value() for m in messages] == [b"at least once"] * 2  # twice, never zero times
    status = handle.status()
    # nothing was heard of the release the dying dispatcher made: it is sent again as the
    # same attempt once its start lease (8 s after it was due) has ended
    assert status is not None and status.attempts == 1


def test_a_message_to_a_missing_topic_fails_after_its_attempts_naming_the_topic(
        scheduler: Scheduler, schedule: Callable[..., Any], unique_name: str) -> None:
    scheduler.dispatcher()
    missing = f"{unique_name}_missing"
    handle = schedule_message(missing, b"x", countdown=1, ordering_id="acct-4", app=schedule.app)
    wait_for_states([handle], State.FAILED, timeout=120)
    status = handle.status()
    assert status is not None and status.attempts == 3  # scheduler_max_attempts of the test app
    assert status.last_error is not None and missing in status.last_error
