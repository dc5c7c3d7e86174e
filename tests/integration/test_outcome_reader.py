"""The outcome reader against real Kafka: it knows up to when it has read every outcome, and a
consumer that stops fetching is replaced without losing one.

A lease that ends without an outcome makes the task run again, so a reader whose consumer
has silently stopped fetching (librdkafka can, after a broker restart) must neither look
current nor stay stalled. The stall is made here by pausing the consumer's partition: it
then fetches nothing and reports no error, as a stalled consumer does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer, TopicPartition

from celery_scheduler.keys import TaskKey
from celery_scheduler.tasklog import outcomes as outcomes_module
from celery_scheduler.tasklog.kafka import client_config, create_topic
from celery_scheduler.tasklog.outcomes import OutcomeReader
from celery_scheduler.wire import Outcome, OutcomeBatch
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(90)


class Reading:
    def __init__(self, bootstrap: str, topic: str) -> None:
        self.batches: list[OutcomeBatch] = []
        self.reader = OutcomeReader(client_config(bootstrap, {}), topic, f"{topic}.group",
                                    self.batches.append, dict)
        self.producer = Producer(client_config(bootstrap, {}))
        self.topic = topic

    def names(self) -> list[str]:
        return [o.key.uniqueness_key for batch in self.batches for o in batch.outcomes]

    def report(self, partition: int, name: str) -> int:
        """Produce one outcome to *partition*; return the wall time (ms) Kafka had it by."""
        outcome = Outcome(TaskKey("o", 1, name), partition, 1, True, None)
        self.producer.produce(self.topic, outcome.encode(), partition=partition)
        assert self.producer.flush(10) == 0
        return int(time.time() * 1000)


@pytest.fixture
def reading(kafka_bootstrap: str, unique_name: str) -> Iterator[Reading]:
    topic = f"{unique_name}.outcomes"
    create_topic(kafka_bootstrap, {}, topic, 2, 1)
    reading = Reading(kafka_bootstrap, topic)
    stopped = threading.Event()
    reading.reader.assign([0, 1])
    thread = reading.reader.start(stopped)
    yield reading
    stopped.set()
    thread.join(10)
    reading.reader.close()


def test_read_until_follows_what_has_been_read(reading: Reading) -> None:
    reader = reading.reader
    assert reader.read_until(0) == 0  # nothing known yet
    produced = reading.report(0, "first")
    wait_until(lambda: reading.names() == ["first"], 20, lambda: "the outcome to be read")
    wait_until(lambda: reader.read_until(0) >= produced and reader.read_until(1) >= produced,
               20, lambda: "both partitions, one of them empty, to be known read past it")
    assert reader.replaced == 0


def test_a_consumer_that_stops_fetching_is_replaced_and_nothing_is_lost(
        reading: Reading) -> None:
    reader = reading.reader
    reading.report(0, "before")
    wait_until(lambda: reading.names() == ["before"], 20, lambda: "the first outcome to be read")
    with reader._lock:
        reader._consumer.pause([TopicPartition(reading.topic, 0)])
    produced = reading.report(0, "while stalled")
    reading.report(1, "on the other partition")
    time.sleep(outcomes_module.STALL_SECONDS - 1)
    # the stalled partition is not taken to be read past what it has not read; the other is
    assert reader.read_until(0) < produced
    assert reader.read_until(1) >= produced
    assert "while stalled" not in reading.names()
    wait_until(lambda: reader.replaced == 1, 20, lambda: "the stalled consumer to be replaced")
    wait_until(lambda: "while stalled" in reading.names(), 20, lambda: "the outcome to be read")
    wait_until(lambda: reader.read_until(0) >= produced, 20, lambda: "the partition to be read past it")
    assert sorted(reading.names()) == ["before", "on the other partition", "while stalled"]
