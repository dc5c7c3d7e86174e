"""A broker of a replicated Kafka cluster dies mid-run: nothing accepted is lost.

The topic has replication factor 3 and ``min.insync.replicas`` 2, and schedule calls use
``acks=all``, so an acknowledged record is on at least two brokers; with one broker down
the other two still form an in-sync majority and keep accepting calls. A real dispatcher
and worker (Cassandra and Redis are the shared services) run everything scheduled.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from celery_scheduler.client import SchedulerClient, set_client
from celery_scheduler.config import get_settings
from celery_scheduler.errors import TaskLogError
from tests.integration.dispatch_fixtures import Scheduler
from tests.integration.kafka_cluster import KafkaCluster, kafka_cluster  # noqa: F401
from tests.services import drop_scheduler

pytestmark = [pytest.mark.kafka, pytest.mark.cassandra, pytest.mark.redis]

ORDERING_IDS = [f"acct-{i}" for i in range(8)]
DELAY = 1.5  # seconds between a schedule call and the task's time


@pytest.fixture
def replicated(kafka_cluster: KafkaCluster, cassandra_contact: str, redis_url: str,  # noqa: F811
               unique_name: str, tmp_path: Path) -> Iterator[Scheduler]:
    execlog = tmp_path / "executions.jsonl"
    env = {**os.environ,
           "CELERY_SCHEDULER_TEST_TOPIC": unique_name, "CELERY_SCHEDULER_TEST_KEYSPACE": unique_name,
           "CELERY_SCHEDULER_TEST_QUEUE": unique_name, "CELERY_SCHEDULER_TEST_EXECLOG": str(execlog),
           "CELERY_SCHEDULER_TEST_KAFKA": kafka_cluster.bootstrap}
    scheduler = Scheduler(env, execlog, tmp_path)
    result = scheduler.cli("init", "--replication-factor", "3")
    assert result.returncode == 0, result.stderr
    yield scheduler
    scheduler.stop_all()
    drop_scheduler("", unique_name)  # the topic goes with the cluster


def check_replication(admin: AdminClient, topic: str) -> int:
    """The topic as `init` made it: three replicas everywhere, two must acknowledge."""
    metadata = admin.list_topics(topic, timeout=10).topics[topic]
    assert {len(p.replicas) for p in metadata.partitions.values()} == {3}
    [config] = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)]).values()
    assert config.result(10)["min.insync.replicas"].value == "2"
    return int(metadata.partitions[0].leader)


def wait_for_full_isr(admin: AdminClient, topic: str, timeout: float) -> float:
    started = time.monotonic()
    while True:
        partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions.values()
        if all(len(p.isrs) == 3 for p in partitions):
            return time.monotonic() - started
        assert time.monotonic() - started < timeout, [p.isrs for p in partitions]
        time.sleep(0.5)


def test_a_killed_broker_loses_no_accepted_task_and_scheduling_goes_on(
        kafka_cluster: KafkaCluster, replicated: Scheduler) -> None:  # noqa: F811
    from tests.apps import dispatching

    topic = replicated.env["CELERY_SCHEDULER_TEST_TOPIC"]
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    victim = check_replication(admin, topic)  # the leader of partition 0: its leadership must move
    settings = get_settings(dispatching.app).replace(
        kafka_bootstrap_servers=kafka_cluster.bootstrap, kafka_topic=topic,
        cassandra_keyspace=replicated.env["CELERY_SCHEDULER_TEST_KEYSPACE"],
        kafka_produce_timeout=30.0)
    client = SchedulerClient(settings)
    previous = set_client(dispatching.app, client)
    replicated.dispatcher()
    replicated.worker()

    accepted: list[tuple[str, int, float]] = []  # (ordering id, seq, when acknowledged)
    refused: list[str] = []
    latencies: list[float] = []
    killed_at = restarted_at = 0.0
    try:
        seq = 0
        started = time.time()
        while time.time() - started < 24:
            elapsed = time.time() - started
            if not killed_at and elapsed > 6:
                kafka_cluster.kill(victim)
                killed_at = time.time()
            ordering_id = ORDERING_IDS[seq % len(ORDERING_IDS)]
            call = time.time()
            try:
                dispatching.record.schedule((ordering_id, seq), {}, at=dt.datetime.fromtimestamp(
                    call + DELAY, dt.timezone.utc))
            except TaskLogError as exc:
                refused.append(f"{seq}: {exc}")
            else:
                accepted.append((ordering_id, seq, time.time()))
                latencies.append(time.time() - call)
            seq += 1
            time.sleep(0.05)
        down_until = time.time()
        kafka_cluster.start(victim)
        restarted_at = time.time()

        expected = {(o, s) for o, s, _ in accepted}
        deadline = time.monotonic() + 90
        while not expected <= {(s["o"], s["seq"]) for s in replicated.starts()}:
            assert time.monotonic() < deadline, (
                f"lost: {sorted(expected - {(s['o'], s['seq']) for s in replicated.starts()})[:20]}")
            time.sleep(0.5)
        rejoined = wait_for_full_isr(admin, topic, timeout=60)
    finally:
        client.close()
        set_client(dispatching.app, previous)

    during = [a for a in accepted if killed_at < a[2] < down_until]
    print(f"{len(accepted)} accepted ({len(during)} while broker {victim} was down), "
          f"{len(refused)} refused; slowest schedule call {max(latencies):.2f}s; "
          f"broker back in every ISR {rejoined:.1f}s after its restart at +{restarted_at - killed_at:.0f}s")
    assert not refused, refused
    # scheduling went on while the broker was down, not just before and after
    assert len(during) >= 10, during
    # per ordering id, the tasks ran in the order they were scheduled
    for ordering_id in ORDERING_IDS:
        ran = [s["seq"] for s in replicated.starts() if s["o"] == ordering_id]
        assert ran == sorted(ran), f"{ordering_id} out of order: {ran}"
