"""While Kafka is away, the outcome reader asks where its partitions end at every check
(about 20 times a second); that it cannot is said once, and again when Kafka answers."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from celery_scheduler.dispatcher.outcomes import OutcomeReader


class Ends:
    def __init__(self) -> None:
        self.away = True

    def offsets_for_times(self, asked: list[TopicPartition], timeout: float) -> Any:
        if self.away:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down"))
        return [TopicPartition(tp.topic, tp.partition, 7) for tp in asked]

    def close(self) -> None:
        pass


def test_an_unanswered_ask_is_said_once_per_outage(caplog: pytest.LogCaptureFixture) -> None:
    reader = OutcomeReader({"bootstrap.servers": "127.0.0.1:1"}, "topic.outcomes", "group",
                           deliver=lambda batch: None, durable=dict)
    reader._consumer.close()
    reader._consumer = ends = Ends()  # type: ignore[assignment]
    reader._assigned = {0, 1}
    caplog.set_level(logging.DEBUG, logger="celery_scheduler.dispatcher.outcomes")
    assert [reader._ends() for _ in range(20)] == [None] * 20
    levels = [record.levelno for record in caplog.records]
    assert levels == [logging.INFO] + [logging.DEBUG] * 19
    assert "broker down" in caplog.records[0].getMessage()
    caplog.clear()
    ends.away = False
    assert reader._ends() == {0: 7, 1: 7}
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "Kafka answers again where the outcome partitions end")]
    caplog.clear()
    ends.away = True
    assert reader._ends() is None  # the next outage is said again
    assert [record.levelno for record in caplog.records] == [logging.INFO]
