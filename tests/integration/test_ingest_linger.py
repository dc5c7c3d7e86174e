"""The ingest loop's linger on the real Kafka and Cassandra: records that trickle in while
every one is due later are written as one batch; a record due soon is written at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from celery_scheduler.clock import now_ms
from celery_scheduler.dispatcher.engine import Engine
from celery_scheduler.dispatcher.ingest import URGENT_SECONDS, Ingest
from celery_scheduler.envelope import ScheduleEnvelope, encode
from celery_scheduler.keys import TaskKey
from celery_scheduler.partitioner import partition_for
from celery_scheduler.store.base import Operation, StoredTask
from celery_scheduler.store.cassandra import CassandraScheduleStore
from celery_scheduler.tasklog.dead_letters import MemoryDeadLetters
from celery_scheduler.tasklog.reader import KafkaTaskLogReader

pytestmark = [pytest.mark.kafka, pytest.mark.cassandra]

PARTITIONS = 6
LINGER = 1.0


class CountingStore(CassandraScheduleStore):
    applied: list[int]

    def apply(self, operations: list[Operation], now_ms: int) -> list[StoredTask | bool | None]:
        self.applied.append(len(operations))
        return super().apply(operations, now_ms)


@pytest.fixture
def store(cassandra_contact: str, unique_name: str) -> Iterator[CountingStore]:
    host, port = cassandra_contact.rsplit(":", 1)
    opened = CountingStore([host], unique_name, port=int(port), consistency="ONE",
                           serial_consistency="SERIAL")
    opened.create_schema()
    opened.applied = []
    yield opened
    opened._session.execute(f"DROP KEYSPACE IF EXISTS {unique_name}")
    opened.close()


@pytest.fixture
def topic(kafka_bootstrap: str, unique_name: str) -> Iterator[str]:
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(unique_name, PARTITIONS, 1)])[unique_name].result(30)
    yield unique_name
    admin.delete_topics([unique_name])[unique_name].result(30)


def _ingest(kafka_bootstrap: str, topic: str, store: CountingStore) -> tuple[Ingest, Consumer]:
    engine = Engine(store, lambda task, release: None, "linger-test")
    engine.assign(range(PARTITIONS))
    engine.step()  # takes the leases
    assert all(engine.may_persist(p) for p in range(PARTITIONS))
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": topic,
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    return Ingest(KafkaTaskLogReader(topic, lambda: consumer), store, engine, MemoryDeadLetters(),
                  lambda: PARTITIONS, linger_seconds=LINGER), consumer


def _produce(producer: Producer, topic: str, envelope: ScheduleEnvelope) -> None:
    ordering_id = envelope.key.ordering_id
    producer.produce(topic, encode(envelope), key=ordering_id.encode(),
                     partition=partition_for(ordering_id, PARTITIONS))
    producer.flush(10)


def _task(n: int, due_in_seconds: float) -> ScheduleEnvelope:
    return ScheduleEnvelope(TaskKey(f"o{n}", now_ms() + int(due_in_seconds * 1000), "u"),
                            "proj.remind", [n])


def _poll_until(ingest: Ingest, count: int) -> list[tuple[int, float]]:
    """Poll until *count* records were written; each poll's records and seconds taken."""
    polls: list[tuple[int, float]] = []
    deadline = time.monotonic() + 30
    while sum(n for n, _ in polls) < count and time.monotonic() < deadline:
        started = time.monotonic()
        written = ingest.poll_once(0.2)
        if written:
            polls.append((written, time.monotonic() - started))
    return polls


def test_records_due_later_that_trickle_in_are_written_as_one_batch(
        kafka_bootstrap: str, topic: str, store: CountingStore) -> None:
    ingest, consumer = _ingest(kafka_bootstrap, topic, store)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    _produce(producer, topic, _task(0, 60))
    tasks = [_task(n, 60) for n in range(1, 13)]

    def trickle() -> None:
        for envelope in tasks:
            time.sleep(0.04)
            _produce(producer, topic, envelope)

    feeder = threading.Thread(target=trickle)
    try:
        feeder.start()
        polls = _poll_until(ingest, 13)
        feeder.join()
        assert sum(n for n, _ in polls) == 13
        # a light load: 13 records over about half a second, without the linger written in
        # two or three polls of 0.2 s, each with its own status reads and writes
        assert store.applied == [13], polls
        assert all(store.status(t.key) is not None for t in tasks)
    finally:
        consumer.close()


def test_a_record_due_soon_is_written_without_the_linger(
        kafka_bootstrap: str, topic: str, store: CountingStore) -> None:
    ingest, consumer = _ingest(kafka_bootstrap, topic, store)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    soon = _task(0, URGENT_SECONDS / 2)
    try:
        _produce(producer, topic, soon)
        polls = _poll_until(ingest, 1)
        assert [n for n, _ in polls] == [1]
        assert polls[0][1] < LINGER / 2  # the poll's own 0.2 s, not the linger
        assert store.status(soon.key) is not None
    finally:
        consumer.close()


def test_a_negative_timeout_reads_what_is_there_and_never_waits_forever(
        kafka_bootstrap: str, topic: str) -> None:
    """Kafka's consumer takes any negative timeout, however small, as "wait forever"; the
    reader port never passes one on (a poll between two paced batches of carried records
    computed one once, and that dispatcher wrote nothing more while nothing new came)."""
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": topic,
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    reader = KafkaTaskLogReader(topic, lambda: consumer)
    reader.consume(10, 1.0)  # the partitions fetched from: nothing to read
    returned = threading.Event()

    def read() -> None:
        reader.consume(10, -1e-6)
        returned.set()

    threading.Thread(target=read, daemon=True).start()
    assert returned.wait(5), "a negative timeout waited on with nothing to read"
    consumer.close()
