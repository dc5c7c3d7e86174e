"""A broker of a replicated Kafka cluster dies mid-run: nothing accepted is lost.

The topic has replication factor 3 and ``min.insync.replicas`` 2, and schedule calls use
``acks=all``, so an acknowledged record is on at least two brokers; with one broker down
the other two still form an in-sync majority and keep accepting calls. A real dispatcher
and worker (Cassandra and Redis are the shared services) run everything scheduled.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from celery_scheduler.errors import TaskLogError
from tests.integration import dispatch_fixtures
from tests.integration.dispatch_fixtures import Scheduler
from tests.integration.kafka_cluster import KafkaCluster, kafka_cluster  # noqa: F401
from tests.integration.raw_topic import own_scheduler, scheduling_client
from tests.waiting import wait_until

# serial: three brokers of its own, killed and stalled, beside no other test
pytestmark = [pytest.mark.kafka, pytest.mark.cassandra, pytest.mark.redis, pytest.mark.serial]

ORDERING_IDS = [f"acct-{i}" for i in range(8)]
DELAY = 1.5  # seconds between a schedule call and the task's time


@pytest.fixture
def replicated(kafka_cluster: KafkaCluster, cassandra_contact: str, redis_url: str,  # noqa: F811
               unique_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Scheduler]:
    # `init` takes the replication factor from scheduler_kafka_replication_factor
    monkeypatch.setattr(dispatch_fixtures, "APP", "tests.apps.secured")
    with own_scheduler(tmp_path, kafka_cluster.bootstrap, unique_name,
                       CELERY_SCHEDULER_TEST_REPLICATION_FACTOR="3") as scheduler:
        yield scheduler


def check_replication(admin: AdminClient, topic: str) -> int:
    """The topics as `init` made them: three replicas everywhere, two must acknowledge."""
    for name in (topic, f"{topic}.deadletter"):
        metadata = admin.list_topics(name, timeout=10).topics[name]
        assert {len(p.replicas) for p in metadata.partitions.values()} == {3}
        [config] = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, name)]).values()
        assert config.result(10)["min.insync.replicas"].value == "2"
    return int(admin.list_topics(topic, timeout=10).topics[topic].partitions[0].leader)


def wait_for_full_isr(admin: AdminClient, topic: str, timeout: float) -> float:
    started = time.monotonic()
    while True:
        partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions.values()
        if all(len(p.isrs) == 3 for p in partitions):
            return time.monotonic() - started
        assert time.monotonic() - started < timeout, [p.isrs for p in partitions]
        time.sleep(0.5)


@dataclass
class Calls:
    accepted: list[tuple[str, int, float]] = field(default_factory=list)  # ordering id, seq, acked at
    refused: list[str] = field(default_factory=list)
    slowest: float = 0.0


def schedule_for(app: Any, seconds: float, calls: Calls, first_seq: int) -> int:
    """Schedule one task at a time for *seconds*, round robin over ORDERING_IDS."""
    seq = first_seq
    until = time.time() + seconds
    while time.time() < until:
        ordering_id = ORDERING_IDS[seq % len(ORDERING_IDS)]
        call = time.time()
        try:
            app.record.schedule((ordering_id, seq), {},
                                at=dt.datetime.fromtimestamp(call + DELAY, dt.timezone.utc))
        except TaskLogError as exc:
            calls.refused.append(f"{seq}: {exc}")
        else:
            calls.accepted.append((ordering_id, seq, time.time()))
            calls.slowest = max(calls.slowest, time.time() - call)
        seq += 1
        time.sleep(0.05)
    return seq


def test_a_killed_broker_loses_no_accepted_task_and_scheduling_goes_on(
        kafka_cluster: KafkaCluster, replicated: Scheduler,  # noqa: F811
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="celery_scheduler.kafka")
    topic = replicated.env["CELERY_SCHEDULER_TEST_TOPIC"]
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    victim = check_replication(admin, topic)  # the leader of partition 0: its leadership must move
    replicated.dispatcher()
    replicated.worker()
    calls = Calls()
    with scheduling_client(replicated.env, kafka_produce_timeout=30.0) as app:
        seq = schedule_for(app, 6, calls, 0)
        kafka_cluster.kill(victim)  # SIGKILL: no controlled shutdown, no leadership hand-over
        killed_at = time.time()
        schedule_for(app, 18, calls, seq)
        down_until = time.time()
        kafka_cluster.start(victim)
        restart = time.time() - down_until

        expected = {(o, s) for o, s, _ in calls.accepted}
        wait_until(lambda: expected <= {(s["o"], s["seq"]) for s in replicated.starts()}, 90,
                   lambda: sorted(expected - {(s["o"], s["seq"]) for s in replicated.starts()})[:20])
    rejoined = wait_for_full_isr(admin, topic, timeout=60)

    during = [a for a in calls.accepted if killed_at < a[2] < down_until]
    print(f"{len(calls.accepted)} accepted ({len(during)} while broker {victim} was down), "
          f"{len(calls.refused)} refused; slowest schedule call {calls.slowest:.2f}s; broker restarted "
          f"in {restart:.0f}s and back in every ISR {rejoined:.1f}s later")
    assert not calls.refused, calls.refused
    # scheduling went on while the broker was down, not just before and after
    assert len(during) >= 10, during
    # per ordering id, the tasks ran in the order they were scheduled
    for ordering_id in ORDERING_IDS:
        ran = [s["seq"] for s in replicated.starts() if s["o"] == ordering_id]
        assert ran == sorted(ran), f"{ordering_id} out of order: {ran}"
    # the application's Kafka client said what happened to the broker through Python logging
    address = kafka_cluster.bootstrap.split(",")[victim - 1]  # broker id N is the Nth address
    said = [r.getMessage() for r in caplog.records if r.name == "celery_scheduler.kafka"]
    assert any(address in line for line in said), f"nothing about {address} in {said[:10]}"


STALL = 25.0  # seconds the leader of partition 0 is stopped
# The controller fences a silent broker after broker.session.timeout.ms (9 s) and moves its
# leadership; clients find the new leader once a request to the stalled one times out
# (socket.timeout.ms, 10 s here) or their metadata refresh (3 s here) names it. With
# librdkafka's defaults (60 s and 5 minutes), every call to the stalled broker's partitions
# waited out the whole stall.
# A call sent as the stall begins waits out socket.timeout.ms (10 s), then the next metadata
# refresh (3 s) and its retry's backoff and request: about 13-15 s on this machine, once
# 15.006 s with every service beside it. The bound leaves room for that and still fails a
# call held for the whole 25 s stall.
STALLED_CALL_BOUND = 18.0


def test_a_stalled_broker_holds_no_call_for_the_whole_stall_and_nothing_is_lost(
        kafka_cluster: KafkaCluster, replicated: Scheduler) -> None:  # noqa: F811
    topic = replicated.env["CELERY_SCHEDULER_TEST_TOPIC"]
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    wait_for_full_isr(admin, topic, timeout=60)
    victim = check_replication(admin, topic)
    replicated.dispatcher()
    replicated.worker()
    calls = Calls()
    with scheduling_client(replicated.env, kafka_produce_timeout=60.0) as app:
        seq = schedule_for(app, 4, calls, 0)
        kafka_cluster.stop(victim)  # SIGSTOP: its connections stay open and silent
        try:
            schedule_for(app, STALL, calls, seq)
        finally:
            kafka_cluster.cont(victim)
        expected = {(o, s) for o, s, _ in calls.accepted}
        wait_until(lambda: expected <= {(s["o"], s["seq"]) for s in replicated.starts()}, 90,
                   lambda: sorted(expected - {(s["o"], s["seq"]) for s in replicated.starts()})[:20])
    print(f"{len(calls.accepted)} accepted, {len(calls.refused)} refused while broker {victim} "
          f"was stalled for {STALL:.0f}s; slowest schedule call {calls.slowest:.2f}s")
    assert not calls.refused, calls.refused
    assert calls.slowest < STALLED_CALL_BOUND
    for ordering_id in ORDERING_IDS:
        ran = [s["seq"] for s in replicated.starts() if s["o"] == ordering_id]
        assert ran == sorted(ran), f"{ordering_id} out of order: {ran}"
