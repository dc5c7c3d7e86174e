"""librdkafka's own messages reach Python logging, under the package's logger, not stderr.

Each Kafka client of the package (the application's producer, a dispatcher's consumers,
``init``'s admin client) is pointed at a loopback port where nothing listens: librdkafka
then logs "Connection refused" from its own threads. The line must arrive as a log record
of ``celery_scheduler.kafka`` (so an application can route or silence it), and nothing may
be written to the process's stderr. The Kafka of ``scripts/services`` is not used.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from contextlib import closing

import pytest
from confluent_kafka import Consumer

from celery_scheduler.errors import TaskLogUnavailableError
from celery_scheduler.tasklog.kafka import KafkaTaskLog, client_config, create_topic
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

REFUSED = "Connection refused"


@pytest.fixture
def nothing_listens() -> str:
    """A loopback address that refuses connections: a port just freed by the kernel."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"127.0.0.1:{port}"


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="celery_scheduler")
    return caplog


def refused_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if REFUSED in r.getMessage()]


def wait_for_refused(caplog: pytest.LogCaptureFixture, poll: Callable[[], object] = lambda: None
                     ) -> list[logging.LogRecord]:
    def refused() -> list[logging.LogRecord]:
        poll()
        return refused_records(caplog)

    return wait_until(refused, 10, "librdkafka's connection-refused line in Python logging",
                      every=0.05)


def assert_logged_not_printed(records: list[logging.LogRecord], capfd: pytest.CaptureFixture[str]
                              ) -> None:
    assert records, "librdkafka's connection-refused line never reached Python logging"
    assert {r.name for r in records} == {"celery_scheduler.kafka"}
    assert all(r.levelno >= logging.WARNING for r in records)
    assert REFUSED not in capfd.readouterr().err


def test_the_application_producer_logs_a_refused_connection(
        nothing_listens: str, logs: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    with closing(KafkaTaskLog(nothing_listens, "nowhere", timeout=1.0)) as log, \
            pytest.raises(TaskLogUnavailableError):
        log.publish("customer-42", b"{}")
    # the task log's own thread polled the producer until it was closed
    assert_logged_not_printed(wait_for_refused(logs), capfd)


def test_a_dispatcher_consumer_logs_a_refused_connection(
        nothing_listens: str, logs: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    # the settings a dispatcher's consumers (ingest and outcome reader) are built from
    with closing(Consumer({**client_config(nothing_listens, {}), "group.id": "nobody"})) as consumer:
        consumer.subscribe(["nowhere"])
        records = wait_for_refused(logs, lambda: consumer.poll(0.1))
    assert_logged_not_printed(records, capfd)


def test_init_logs_why_it_could_not_reach_kafka(
        nothing_listens: str, logs: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    # an admin client is not polled otherwise: its lines are handed over when a request fails
    with pytest.raises(TaskLogUnavailableError, match="did not answer"):
        create_topic(nothing_listens, {}, "nowhere", partitions=1, replication_factor=1, timeout=1.0)
    assert_logged_not_printed(refused_records(logs), capfd)
