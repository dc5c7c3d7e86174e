"""The outcome reader's checks of where its partitions end, with fake consumers; its hand-over
and close with a real consumer whose broker is unreachable.

While Kafka is away the reader asks at every check (about 20 times a second); that it
cannot is said once, and again when Kafka answers. A partition left out of an answer is
asked for again, and one that stops being read is noticed while others go on.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from celery_scheduler.tasklog import outcomes
from celery_scheduler.tasklog.outcomes import OutcomeReader


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
    caplog.set_level(logging.DEBUG, logger="celery_scheduler.tasklog.outcomes")
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


class PartialEnds:
    """Answers where partitions end, but with no offset for those in ``missing`` (as Kafka
    may just after a broker restart, for a partition whose leader is not known yet)."""

    def __init__(self, ends: dict[int, int], missing: set[int]) -> None:
        self.ends = ends
        self.missing = missing
        self.asked = 0

    def offsets_for_times(self, asked: list[TopicPartition], timeout: float) -> Any:
        self.asked += 1
        return [TopicPartition(tp.topic, tp.partition,
                               -1 if tp.partition in self.missing else self.ends[tp.partition])
                for tp in asked]

    def close(self) -> None:
        pass


def reader_with(consumer: Any) -> OutcomeReader:
    reader = OutcomeReader({"bootstrap.servers": "127.0.0.1:1"}, "topic.outcomes", "group",
                           deliver=lambda batch: None, durable=dict)
    reader._consumer.close()
    reader._consumer = consumer
    reader._assigned = {0, 1}
    return reader


def test_a_partition_left_out_of_the_ends_is_asked_for_again() -> None:
    ends = PartialEnds({0: 7, 1: 3}, missing={1})
    reader = reader_with(ends)
    reader._note_reached(0, 7)
    reader._note_reached(1, 3)
    reader.check()
    assert reader.read_until(0) > 0 and reader.read_until(1) == 0
    ends.missing.clear()  # the leader is known again
    reader.check()
    assert ends.asked == 2
    assert reader.read_until(1) == reader.read_until(0) > 0


def test_a_partition_that_stops_while_another_goes_on_replaces_the_consumer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(outcomes.time, "monotonic", lambda: clock[0])
    reader = reader_with(PartialEnds({0: 7, 1: 3}, missing=set()))
    replaced: list[object] = []
    monkeypatch.setattr(reader, "_replace_consumer", replaced.append)
    reader._note_reached(1, 1)  # partition 1 stops at 1 of 3
    offset = 0
    while clock[0] < 1000.0 + outcomes.STALL_SECONDS - 0.5:
        offset += 1
        reader._note_reached(0, offset)  # partition 0 keeps arriving
        reader.check()
        clock[0] += 0.25
    assert replaced == []  # not yet
    clock[0] += 1.0
    reader._note_reached(0, offset + 1)
    reader.check()
    assert replaced == [{0: 7, 1: 3}]


def test_a_hand_over_does_not_wait_for_kafka_to_take_the_commit() -> None:
    # A synchronous commit has no timeout: while Kafka is away it waits for it to come back,
    # and a hand-over that waits keeps the partitions from their new owner. A real consumer,
    # its broker unreachable: a synchronous commit waits the session timeout for a group
    # coordinator, and closing waits as long for the commits under way.
    config = {"bootstrap.servers": "127.0.0.1:1", "log_level": 0, "session.timeout.ms": 4000,
              "heartbeat.interval.ms": 1000}
    reader = OutcomeReader(config, "topic.outcomes", "group", deliver=lambda batch: None,
                           durable=lambda: {0: 5, 1: 9})
    reader.assign([0, 1])
    handing_over = threading.Thread(target=reader.revoke, args=([0],), daemon=True)
    handing_over.start()
    handing_over.join(2.0)
    assert not handing_over.is_alive(), "the hand-over waited for an unreachable Kafka"
    assert reader._assigned == {1}
    closing = threading.Thread(target=reader.close, daemon=True)
    closing.start()
    closing.join(10.0)
    assert not closing.is_alive(), "closing waited for an unreachable Kafka"
