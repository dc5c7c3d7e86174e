"""The batches' producer: records in order, a full queue waited for, failures named, a stuck
producer given up and replaced. A fake producer stands in for librdkafka's, so each case
runs at the moment the test names; ``tests/integration/test_schedule_many.py`` runs it
against Kafka."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from celery_scheduler.errors import TaskLogError, TaskLogUnavailableError
from celery_scheduler.tasklog import bulk
from celery_scheduler.tasklog.bulk import BulkProducer
from tests.unit.fakes import FakeProducer


def _translate(error: KafkaError, key: str) -> Exception:
    return TaskLogUnavailableError(f"{key}: {error.str()}")


@pytest.fixture
def producer(monkeypatch: pytest.MonkeyPatch) -> Iterator[BulkProducer]:
    FakeProducer.made = []
    monkeypatch.setattr(bulk, "Producer", lambda config: FakeProducer(config, hold=True))
    monkeypatch.setattr(bulk, "FULL_WAIT", 0.001)
    yield BulkProducer({"bootstrap.servers": "x", "error_cb": print, "linger.ms": 0}, "topic",
                       0.2, _translate)


RECORDS = [(f"o{i}", f"v{i}".encode()) for i in range(5)]


def test_it_reports_only_failures_and_lingers(producer: BulkProducer) -> None:
    config = FakeProducer.made[0].config
    assert config["delivery.report.only.error"] is True and config["linger.ms"] == 5
    assert "error_cb" not in config  # the task log's error callback is its own producer's


def test_records_go_in_order_and_the_batch_is_done_once_the_producer_is_empty(
        producer: BulkProducer) -> None:
    batch = producer.publish(RECORDS)
    fake = FakeProducer.made[-1]
    assert [record.key for record in fake.held] == ["o0", "o1", "o2", "o3", "o4"]
    assert not batch.done()
    fake.deliver()
    assert batch.done()
    batch.wait(1)


class Lazy(Collection[tuple[str, bytes]]):
    """RECORDS, each made as it is taken, noting how many records the producer held then."""

    def __init__(self) -> None:
        self.made_with: list[int] = []

    def __len__(self) -> int:
        return len(RECORDS)

    def __iter__(self) -> Iterator[tuple[str, bytes]]:
        for record in RECORDS:
            self.made_with.append(len(FakeProducer.made[-1].held))
            yield record

    def __contains__(self, record: object) -> bool:
        return record in RECORDS


@pytest.mark.parametrize("per_poll", [None, 1])
def test_a_full_queue_is_waited_for_and_nothing_is_produced_or_made_twice(
        producer: BulkProducer, monkeypatch: pytest.MonkeyPatch, per_poll: int | None) -> None:
    fake = FakeProducer.made[-1]
    fake.room = 2
    delivered: list[str] = []

    def poll(timeout: float = 0) -> int:  # the broker takes what is queued, or the oldest
        delivered.extend(record.key for record in fake.held[:per_poll])
        fake.deliver(per_poll)
        return 0

    monkeypatch.setattr(fake, "poll", poll)
    records = Lazy()
    producer.publish(records)
    delivered.extend(record.key for record in fake.held)
    assert delivered == ["o0", "o1", "o2", "o3", "o4"]
    assert len(records.made_with) == 5  # one a full queue refused is not made again


def test_records_are_made_one_at_a_time_as_they_are_produced(producer: BulkProducer) -> None:
    records = Lazy()
    producer.publish(records)
    assert records.made_with == [0, 1, 2, 3, 4]
    assert [record.key for record in FakeProducer.made[-1].held] == ["o0", "o1", "o2", "o3", "o4"]


def test_each_record_gets_the_headers_made_from_it(producer: BulkProducer) -> None:
    producer.publish(RECORDS[:2], lambda key, value: {"sig": key.encode() + value})
    headers = [record.headers for record in FakeProducer.made[-1].produced]
    assert headers == [[("sig", b"o0v0")], [("sig", b"o1v1")]]


def test_a_queue_that_stays_full_says_how_many_were_produced(producer: BulkProducer) -> None:
    FakeProducer.made[-1].room = 3
    with pytest.raises(TaskLogUnavailableError, match=r"full for 0.2s after 3 of 5 record"):
        producer.publish(RECORDS)


def test_failed_records_are_named_and_the_others_count_as_acknowledged(
        producer: BulkProducer) -> None:
    batch = producer.publish(RECORDS)
    fake = FakeProducer.made[-1]
    fake.fail("o3")
    fake.deliver()
    assert batch.done() and batch.failed() == [("o3", b"v3")]
    with pytest.raises(TaskLogUnavailableError, match=r"1 of 5 record\(s\) .*o3: timed out"):
        batch.wait(1)


def test_a_wait_that_times_out_gives_the_rest_up_and_replaces_the_producer(
        producer: BulkProducer) -> None:
    batch = producer.publish(RECORDS)
    stuck = FakeProducer.made[-1]
    stuck.deliver(2)
    with pytest.raises(TaskLogUnavailableError, match=r"3 of 5 record\(s\) .*purged"):
        batch.wait(0.01)
    assert batch.failed() == RECORDS[2:]
    assert producer.replaced == 1 and FakeProducer.made[-1] is not stuck
    again = producer.publish(RECORDS[:1])  # the next batch goes to the new producer
    assert [record.key for record in FakeProducer.made[-1].held] == ["o0"] and not again.done()


def test_a_fatal_error_replaces_the_producer_once(producer: BulkProducer) -> None:
    first = FakeProducer.made[-1]
    first.fatal_once = True
    producer.publish(RECORDS[:2])
    assert producer.replaced == 1
    assert [record.key for record in FakeProducer.made[-1].held] == ["o0", "o1"]


def test_an_error_that_is_not_fatal_is_raised(producer: BulkProducer,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too large"))

    monkeypatch.setattr(FakeProducer.made[-1], "produce", refuse)
    with pytest.raises(TaskLogError, match="o0: too large"):
        producer.publish(RECORDS)
