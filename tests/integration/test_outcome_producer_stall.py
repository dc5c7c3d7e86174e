"""A worker's outcome producer that hears nothing from a stalled broker is replaced, and no
outcome is lost: what the old producer held is sent by the new one once the broker answers.

The broker is the test's own, stalled with SIGSTOP: its connections stay open and silent, as
after a restart left the client waiting for a partition leader it had not learnt of. Without
the replacement the client holds the outcomes until its delivery timeout (a minute), and the
dispatcher, hearing nothing, would release their tasks again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, TopicPartition

from celery_scheduler.config import Settings
from celery_scheduler.keys import TaskKey
from celery_scheduler.tasklog import outcome_producer
from celery_scheduler.tasklog.kafka import create_topic
from celery_scheduler.wire import Outcome, outcome_topic
from tests.integration.kafka_cluster import KafkaCluster, kafka_broker  # noqa: F401

# one test at a time among those that run a Kafka broker of their own (kafka_cluster's ports)
pytestmark = [pytest.mark.kafka, pytest.mark.xdist_group("own-kafka-broker")]

PARTITIONS = 2
STALL_SECONDS = outcome_producer.STUCK_AFTER_SECONDS + 3  # long enough to be found stuck once


@pytest.fixture
def producer(kafka_broker: KafkaCluster, unique_name: str  # noqa: F811
             ) -> Iterator[outcome_producer.OutcomeProducer]:
    settings = Settings.from_mapping({"scheduler_kafka_bootstrap_servers": kafka_broker.bootstrap,
                                      "scheduler_kafka_topic": unique_name})
    create_topic(kafka_broker.bootstrap, {}, outcome_topic(unique_name), PARTITIONS, 1)
    producer = outcome_producer.OutcomeProducer(settings)
    yield producer
    producer.flush(5)


def outcome(n: int) -> Outcome:
    return Outcome(TaskKey(f"acct-{n % 5}", 1_000 * n, f"step-{n}"), n % PARTITIONS, 1, True, None)


def read_back(bootstrap: str, topic: str, wanted: int, timeout: float) -> set[TaskKey]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "outcome-producer-stall",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, n, 0) for n in range(PARTITIONS)])
    keys: set[TaskKey] = set()
    deadline = time.monotonic() + timeout
    try:
        while len(keys) < wanted and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                read = Outcome.decode(message.value())
                assert read is not None
                keys.add(read.key)
    finally:
        consumer.close()
    return keys


def test_a_producer_stalled_by_its_broker_is_replaced_and_every_outcome_arrives(
        kafka_broker: KafkaCluster, producer: outcome_producer.OutcomeProducer) -> None:  # noqa: F811
    before = [outcome(n) for n in range(10)]
    during = [outcome(n) for n in range(10, 30)]
    for sent in before:
        producer.send(sent)
    assert producer.flush(10) == 0
    # when: the broker stalls while outcomes wait for their reports
    kafka_broker.stop(1)
    try:
        for sent in during:
            producer.send(sent)
        stalled = time.monotonic()
        while time.monotonic() - stalled < STALL_SECONDS:
            producer.poll()  # as the worker's beat thread does
            time.sleep(0.2)
        # then: the producer was found stuck and replaced while the broker was silent
        assert producer.replaced == 1
    finally:
        kafka_broker.cont(1)
    # and: once the broker answers, the new producer delivers what the old one held
    deadline = time.monotonic() + 30
    while producer.flush(1) and time.monotonic() < deadline:
        pass
    assert producer.flush(1) == 0, "the new producer did not deliver the outcomes it took over"
    topic = outcome_topic(producer.topic.removesuffix(".outcomes"))
    wanted = {sent.key for sent in before + during}
    assert read_back(kafka_broker.bootstrap, topic, len(wanted), 30) == wanted
