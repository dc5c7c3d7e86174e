"""Helpers for tests that write to the scheduler topic as a foreign producer would.

A test gets a scheduler of its own (topic, keyspace and queue), produces raw records into
chosen partitions, and reads the dead-letter topic back by each record's source offset;
:func:`read_topic` reads what the package itself wrote to a topic.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from celery_scheduler.client import SchedulerClient, set_client
from celery_scheduler.config import get_settings
from tests.integration.dispatch_fixtures import Scheduler
from tests.services import drop_scheduler

PARTITIONS = 6  # tests.apps.dispatching's default


def read_topic(bootstrap: str, topic: str, expected: int) -> dict[int, list[bytes]]:
    """The values of *topic*'s records by partition, in order, once *expected* were read
    (or after a minute)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-check",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, n, 0) for n in range(PARTITIONS)])
    found: dict[int, list[bytes]] = {n: [] for n in range(PARTITIONS)}
    deadline = time.monotonic() + 60
    try:
        while sum(map(len, found.values())) < expected and time.monotonic() < deadline:
            for message in consumer.consume(5000, 1.0):
                if message.error() is None:
                    found[message.partition()].append(message.value())
    finally:
        consumer.close()
    return found


@contextlib.contextmanager
def own_scheduler(tmp: Path, kafka: str, name: str, *init_args: str, **env: str) -> Iterator[Scheduler]:
    """A scheduler on topic/keyspace/queue *name*, initialised, dropped afterwards."""
    execlog = tmp / "executions.jsonl"
    environment = {**os.environ,
                   "CELERY_SCHEDULER_TEST_TOPIC": name, "CELERY_SCHEDULER_TEST_KEYSPACE": name,
                   "CELERY_SCHEDULER_TEST_QUEUE": name, "CELERY_SCHEDULER_TEST_EXECLOG": str(execlog),
                   "CELERY_SCHEDULER_TEST_KAFKA": kafka, **env}
    scheduler = Scheduler(environment, execlog, tmp)
    result = scheduler.cli("init", *init_args)
    assert result.returncode == 0, result.stderr
    try:
        yield scheduler
    finally:
        scheduler.stop_all(kill_workers=True)
        drop_scheduler(name, name)


@contextlib.contextmanager
def scheduling_client(env: Mapping[str, str], **changes: Any) -> Iterator[Any]:
    """tests.apps.dispatching, scheduling from this process onto the topic *env* names."""
    from tests.apps import dispatching

    settings = get_settings(dispatching.app).replace(**{
        "kafka_bootstrap_servers": env["CELERY_SCHEDULER_TEST_KAFKA"],
        "kafka_topic": env["CELERY_SCHEDULER_TEST_TOPIC"],
        "cassandra_keyspace": env["CELERY_SCHEDULER_TEST_KEYSPACE"], **changes})
    client = SchedulerClient(settings)
    previous = set_client(dispatching.app, client)
    try:
        yield dispatching
    finally:
        client.close()
        set_client(dispatching.app, previous)


def envelope(ordering_id: str, seq: int, at_ms: int, task: str = "dispatching.record",
             **changes: Any) -> dict[str, Any]:
    """A valid schedule envelope for tests.apps.dispatching, as a JSON document."""
    document: dict[str, Any] = {
        "v": 1, "type": "schedule", "task": task,
        "key": {"ordering_id": ordering_id, "at": at_ms, "unique": f"seq-{seq}"},
        "args": [ordering_id, seq], "kwargs": {}, "options": {},
        "retry": {"max_attempts": 3, "backoff": 0.2, "backoff_max": 1.0},
        "enqueued_at": int(time.time() * 1000)}
    document.update(changes)
    return document


def as_bytes(document: Any) -> bytes:
    return json.dumps(document, ensure_ascii=False).encode("utf-8")


class RawProducer:
    """Produces records exactly as given: any key (or none), any value, any partition."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.producer = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 2_000_000})

    def send(self, key: bytes | None, value: bytes | None, partition: int,
             headers: list[tuple[str, bytes]] | None = None) -> str:
        """Produce one record and wait for it; return its source, ``topic/partition/offset``."""
        sources: list[str] = []

        def delivered(error: Any, message: Any) -> None:
            assert error is None, error
            sources.append(f"{message.topic()}/{message.partition()}/{message.offset()}")

        self.producer.produce(self.topic, key=key, value=value, partition=partition,
                              headers=headers or [], on_delivery=delivered)
        assert self.producer.flush(30) == 0
        return sources[0]


def dead_letters(bootstrap: str, topic: str, count: int, timeout: float = 45) -> dict[str, str]:
    """Read ``<topic>.deadletter`` until *count* records arrived: source -> reason."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-dead-letter-check",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([f"{topic}.deadletter"])
    found: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(found) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                headers = dict(message.headers() or [])
                found[headers["source"].decode()] = headers["reason"].decode()
    finally:
        consumer.close()
    return found
