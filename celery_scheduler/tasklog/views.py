"""What operators read of the topics: how far behind the dispatchers' group is, and the
dead letters (see :mod:`celery_scheduler.operations`, which shows them)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from celery_scheduler.config import Settings
from celery_scheduler.errors import TaskLogUnavailableError
from celery_scheduler.tasklog.kafka import client_config, topic_partitions
from celery_scheduler.tasklog.reader import kafka_errors
from celery_scheduler.tasklog.topics import dead_letter_topic, dispatcher_group

__all__ = ["Letter", "consumer_lag", "dead_letters"]


class Letter(NamedTuple):
    """A record of the dead-letter topic: where it sits, its headers, key and value."""

    offset: int
    headers: dict[str, str]
    key: bytes | None
    value: bytes | None


def _consumer(settings: Settings, group_id: str, **config: Any) -> Consumer:
    return Consumer({**client_config(settings.kafka_bootstrap_servers, settings.kafka_options),
                     "group.id": group_id, "enable.auto.commit": False, **config})


def consumer_lag(settings: Settings, timeout: float = 10.0) -> dict[int, int | None]:
    """Per partition, how many records the dispatchers' group has not committed yet."""
    consumer = _consumer(settings, dispatcher_group(settings.kafka_topic))
    try:
        count = topic_partitions(consumer, settings.kafka_topic, timeout)  # type: ignore[arg-type]
        wanted = [TopicPartition(settings.kafka_topic, n) for n in range(count)]
        with kafka_errors("say the dispatchers' offsets"):
            committed = consumer.committed(wanted, timeout=timeout)
            lags: dict[int, int | None] = {}
            for tp in committed:
                low, high = consumer.get_watermark_offsets(tp, timeout=timeout)
                lags[tp.partition] = high - (tp.offset if tp.offset >= 0 else low)
        return lags
    finally:
        consumer.close()


def _headers(headers: Any) -> dict[str, str]:
    return {header[0]: header[1].decode("utf-8", "replace") for header in headers or ()
            if isinstance(header, tuple) and isinstance(header[1], bytes)}


def dead_letters(settings: Settings, timeout: float = 10.0) -> Iterator[Letter]:
    """The dead-letter topic's records, from the oldest kept to the newest."""
    topic = dead_letter_topic(settings.kafka_topic)
    consumer = _consumer(settings, topic + ".operator", **{"enable.partition.eof": True})
    try:
        count = topic_partitions(consumer, topic, timeout)  # type: ignore[arg-type]
        with kafka_errors(f"read {topic}"):
            ends = {n: consumer.get_watermark_offsets(TopicPartition(topic, n), timeout=timeout)[1]
                    for n in range(count)}
            consumer.assign([TopicPartition(topic, n, OFFSET_BEGINNING) for n in range(count)])
        left = {n for n, end in ends.items() if end > 0}
        while left:
            with kafka_errors(f"read {topic}"):
                message = consumer.poll(timeout)
            if message is None:
                raise TaskLogUnavailableError(f"Kafka stopped answering while {topic} was read")
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    left.discard(message.partition())
                    continue
                raise TaskLogUnavailableError(f"reading {topic}: {error}")
            number = message.partition() or 0
            if (message.offset() or 0) + 1 >= ends[number]:
                left.discard(number)
            key, value = message.key(), message.value()
            yield Letter(message.offset() or 0, _headers(message.headers()),
                         key if isinstance(key, bytes) else None,
                         value if isinstance(value, bytes) else None)
    finally:
        consumer.close()
