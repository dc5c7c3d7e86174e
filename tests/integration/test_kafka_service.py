"""The local Kafka broker really stores and serves records, partitioned like the Java client."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from celery_scheduler.partitioner import partition_for

pytestmark = pytest.mark.kafka
PARTITIONS = 6


@pytest.fixture
def topic(kafka_bootstrap: str, unique_name: str) -> Iterator[str]:
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(unique_name, PARTITIONS, 1)])[unique_name].result(timeout=30)
    yield unique_name
    admin.delete_topics([unique_name])[unique_name].result(timeout=30)


def test_keyed_records_round_trip_into_the_java_partition(kafka_bootstrap: str, topic: str) -> None:
    # given a producer configured as the scheduler's (Java-compatible murmur2, acks=all)
    producer = Producer({
        "bootstrap.servers": kafka_bootstrap,
        "partitioner": "murmur2_random",
        "acks": "all",
        "enable.idempotence": True,
    })
    keys = [f"customer-{i}" for i in range(40)]
    delivered: dict[str, int] = {}

    def on_delivery(err: object, msg: object) -> None:
        assert err is None, err
        delivered[msg.key().decode()] = msg.partition()  # type: ignore[attr-defined]

    # when each key is produced and acknowledged
    for key in keys:
        producer.produce(topic, key=key, value=f"payload of {key}".encode(), on_delivery=on_delivery)
    assert producer.flush(30) == 0

    # then the broker put each key where Kafka's Java partitioner would
    assert delivered == {key: partition_for(key, PARTITIONS) for key in keys}
    assert len(set(delivered.values())) > 1

    # and a consumer reads every record back unchanged
    consumer = Consumer({
        "bootstrap.servers": kafka_bootstrap,
        "group.id": f"{topic}-reader",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })
    consumer.subscribe([topic])
    received: dict[str, bytes] = {}
    deadline = time.monotonic() + 60
    try:
        while len(received) < len(keys) and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            received[msg.key().decode()] = msg.value()
            assert msg.partition() == partition_for(msg.key(), PARTITIONS)
    finally:
        consumer.close()
    assert received == {key: f"payload of {key}".encode() for key in keys}
