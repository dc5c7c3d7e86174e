"""The Kafka clients a dispatcher uses, made from its settings.

A dispatcher reads the scheduler topic as a member of the dispatchers' group (and, while
its group forms again, the partitions it keeps with a reader of its own), copies rejected
records to the dead-letter topic, reads the workers' outcomes and produces delayed
messages. Every client is made here, with the settings each needs; the dispatcher gets them
through the task log's ports and imports no driver.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer

from celery_scheduler.config import Settings
from celery_scheduler.errors import SchedulerError, TaskLogUnavailableError
from celery_scheduler.metrics import Metrics
from celery_scheduler.tasklog.dead_letters import DeadLetters
from celery_scheduler.tasklog.delivery import KafkaDelivery
from celery_scheduler.tasklog.kafka import client_config, topic_partitions
from celery_scheduler.tasklog.outcomes import OutcomeReader
from celery_scheduler.tasklog.reader import HandAssignedReader, KafkaTaskLogReader
from celery_scheduler.tasklog.topics import dead_letter_topic, outcome_group, outcome_topic
from celery_scheduler.wire import OutcomeBatch

__all__ = ["DispatcherClients", "topic_problems"]

logger = logging.getLogger("celery_scheduler.dispatcher.service")

# Longest the broker holds a fetch of schedule records back to fill it (milliseconds).
INGEST_FETCH_WAIT_MS = 100


def _log_commit_failure(error: KafkaError | None, partitions: list[Any]) -> None:
    # Offsets are committed asynchronously; a failed commit means those records are read
    # and written again by whoever reads the partition next, which is harmless.
    if error is not None and error.code() != KafkaError._NO_OFFSET:
        logger.info("Kafka did not take an offset commit (%s); those records will be read again",
                    error)


class DispatcherClients:
    """Makes one dispatcher's Kafka clients: *owner* names it to the brokers, *group_id* is
    the dispatchers' group."""

    def __init__(self, settings: Settings, owner: str, group_id: str) -> None:
        self.settings = settings
        self.owner = owner
        self.group_id = group_id
        self.base = client_config(settings.kafka_bootstrap_servers, settings.kafka_options)
        self._metadata = Producer(self.base)
        # the dead-letter producer: acknowledged by every in-sync replica, never twice
        self._producer = Producer({**self.base, "acks": "all", "enable.idempotence": True})
        self.consumer_config = {
            # A schedule record is rarely due the moment it is read: gather up to 100 ms of
            # records per fetch instead of one fetch per record, which cost the broker more
            # CPU than the record (fetch.* in scheduler_kafka_options override this).
            "fetch.wait.max.ms": INGEST_FETCH_WAIT_MS, "fetch.min.bytes": 64 * 1024,
            **self.base,
            "group.id": group_id,
            "client.id": owner,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1500,
            "on_commit": _log_commit_failure,
            # a partition read to its end says so: its ingest has caught up (caught_up.py)
            "enable.partition.eof": True,
        }

    def partitions(self, topic: str) -> Callable[[], int]:
        """A call that asks Kafka how many partitions *topic* has."""
        return lambda: topic_partitions(self._metadata, topic, self.settings.kafka_produce_timeout)

    def group_reader(self) -> KafkaTaskLogReader:
        """The scheduler topic's reader, a member of the dispatchers' group once subscribed."""
        return KafkaTaskLogReader(self.settings.kafka_topic, lambda: Consumer(self.consumer_config))

    def kept_reader(self) -> HandAssignedReader:
        """A reader of the group's that never joins it (see ``dispatcher/kept.py``)."""
        config = {key: value for key, value in self.consumer_config.items()
                  if key not in ("partition.assignment.strategy", "session.timeout.ms",
                                 "heartbeat.interval.ms", "on_commit")}
        config["client.id"] = f"{self.owner}-kept"
        return HandAssignedReader(self.settings.kafka_topic, lambda: Consumer(config))

    def dead_letters(self, metrics: Metrics) -> DeadLetters:
        return DeadLetters(self._producer, dead_letter_topic(self.settings.kafka_topic), metrics)

    def outcome_reader(self, deliver: Callable[[OutcomeBatch], None],
                       durable: Callable[[], dict[int, int]]) -> OutcomeReader:
        return OutcomeReader(self.base, outcome_topic(self.settings.kafka_topic),
                             outcome_group(self.group_id), deliver, durable)

    def delivery(self, report: Callable[[OutcomeBatch], None]) -> KafkaDelivery:
        """The producer of delayed Kafka messages (``schedule_message``)."""
        return KafkaDelivery(self.base, report)


def topic_problems(settings: Settings) -> list[str]:
    """What stops a dispatcher from using its topics (the scheduler topic, its dead letters
    and outcomes); empty if nothing does."""
    problems: list[str] = []
    producer = Producer(client_config(settings.kafka_bootstrap_servers, settings.kafka_options))
    for topic in (settings.kafka_topic, dead_letter_topic(settings.kafka_topic),
                  outcome_topic(settings.kafka_topic)):
        try:
            topic_partitions(producer, topic, min(settings.kafka_produce_timeout, 5.0))
        except TaskLogUnavailableError as exc:  # no broker answers: the other topics alike
            problems.append(f"kafka: {exc}")
            break
        except SchedulerError as exc:
            problems.append(f"kafka: {exc}")
    return problems
