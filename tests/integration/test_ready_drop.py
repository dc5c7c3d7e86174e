"""``scheduler ready`` waits until dispatchers lease every partition; ``scheduler drop``
removes a test environment's topics, groups and keyspace (real Kafka and Cassandra)."""

from __future__ import annotations

import time

from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient

from tests.integration.dispatch_fixtures import Scheduler
from tests.services import KAFKA
from tests.waiting import wait_until


def test_ready_exits_0_only_once_every_partition_is_leased(scheduler: Scheduler) -> None:
    before = scheduler.cli("ready", timeout=60)
    assert before.returncode == 1, before.stdout + before.stderr
    assert "not ready: 0 of 6 partitions leased" in before.stderr
    assert "not leased: 0, 1, 2" in before.stderr

    dispatcher = scheduler.dispatcher(wait=False)
    started = time.monotonic()
    waited = scheduler.cli("ready", "--wait", "60", timeout=120)
    took = time.monotonic() - started
    assert waited.returncode == 0, waited.stdout + waited.stderr + scheduler.log_of(dispatcher)[-2000:]
    assert "ready: 6 of 6 partitions leased by 1 dispatcher(s)" in waited.stdout
    assert "leased partition" in scheduler.log_of(dispatcher)  # it really holds them
    print(f"ready after {took:.1f}s")


def committed(group: str) -> bool:
    """Whether consumer group *group* holds a committed offset."""
    admin = AdminClient({"bootstrap.servers": KAFKA})  # kept until the answer comes
    [future] = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)],
                                                 request_timeout=10).values()
    return any(tp.offset >= 0 for tp in future.result(timeout=15).topic_partitions or ())


def test_drop_needs_yes_refuses_while_dispatchers_run_and_then_removes_everything(
        scheduler: Scheduler, schedule) -> None:
    topic = scheduler.env["CELERY_SCHEDULER_TEST_TOPIC"]
    asked = scheduler.cli("drop", timeout=60, answer="n\n")  # no --yes: it asks, and is told no
    assert asked.returncode != 0
    assert f"kafka topic {topic}.outcomes" in asked.stdout and "Aborted" in asked.stderr
    assert topic in AdminClient({"bootstrap.servers": KAFKA}).list_topics(timeout=10).topics

    dispatcher = scheduler.dispatcher()
    # a record read and committed: Kafka may forget at once a group left with no offset
    schedule.record.schedule(("drop", 1), {}, countdown=3600)
    wait_until(lambda: committed(f"{topic}.dispatchers"), 60, "the dispatchers' offset committed")
    busy = scheduler.cli("drop", "--yes", timeout=120)
    assert busy.returncode == 1
    assert f"consumer group {topic}.dispatchers still has members" in busy.stderr
    assert topic in AdminClient({"bootstrap.servers": KAFKA}).list_topics(timeout=10).topics

    dispatcher.terminate()
    dispatcher.wait(timeout=60)
    dropped = scheduler.cli("drop", "--yes", timeout=120)
    assert dropped.returncode == 0, dropped.stderr
    for name in (f"kafka topic {topic}", f"kafka topic {topic}.deadletter",
                 f"kafka topic {topic}.outcomes", f"consumer group {topic}.dispatchers",
                 f"cassandra keyspace {topic}"):
        assert f"dropped {name}" in dropped.stdout, dropped.stdout
    # the outcome readers' group commits only outcomes' offsets (none here): Kafka may have
    # forgotten it already
    outcomes = f"consumer group {topic}.dispatchers.outcomes"
    assert f"dropped {outcomes}" in dropped.stdout or f"{outcomes}: not there" in dropped.stdout
    # topic deletion is asynchronous in Kafka
    wait_until(lambda: topic not in AdminClient({"bootstrap.servers": KAFKA}).list_topics(timeout=10).topics,
               30, "the topic no longer listed", every=0.5)

    again = scheduler.cli("drop", "--yes", timeout=120)  # nothing left: said, not an error
    assert again.returncode == 0, again.stderr
    assert f"cassandra keyspace {topic}: not there" in again.stdout
    assert f"kafka topic {topic}: not there" in again.stdout
