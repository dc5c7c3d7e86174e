"""An environment's topics and consumer groups: how many partitions a topic has once made
(``scheduler init``), and their deletion (``scheduler drop``)."""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from celery_scheduler.config import Settings
from celery_scheduler.errors import TaskLogError, TopicMissingError
from celery_scheduler.tasklog.kafka import client_config, topic_partitions
from celery_scheduler.tasklog.reader import kafka_errors

__all__ = ["delete", "partitions_of"]


def partitions_of(settings: Settings, topic: str, created: bool) -> int:
    """How many partitions *topic* has; one just *created* is waited for, since another
    broker than the one that saw it created may not know it yet."""
    admin = AdminClient(client_config(settings.kafka_bootstrap_servers, settings.kafka_options))
    deadline = time.monotonic() + settings.kafka_produce_timeout
    while True:
        try:
            return topic_partitions(admin, topic, settings.kafka_produce_timeout)
        except TopicMissingError:
            if not created or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def delete(settings: Settings, groups: Collection[str], topics: Collection[str],
           timeout: float) -> tuple[list[str], list[str]]:
    """Delete *groups*, then *topics*; return what was removed and what was not there.

    Raises :class:`~celery_scheduler.errors.TaskLogError` when a group still has members
    (stop the dispatchers first) or Kafka refuses a deletion, before any topic is touched.
    """
    removed: list[str] = []
    absent: list[str] = []
    admin = AdminClient(client_config(settings.kafka_bootstrap_servers, settings.kafka_options))
    with kafka_errors("delete the scheduler's consumer groups"):
        deleted = admin.delete_consumer_groups(list(groups), request_timeout=timeout)
    _settle(deleted, "consumer group", KafkaError.GROUP_ID_NOT_FOUND, removed, absent, timeout,
            busy=KafkaError.NON_EMPTY_GROUP)
    with kafka_errors("delete the scheduler's topics"):
        deleted = admin.delete_topics(list(topics), operation_timeout=timeout)
    _settle(deleted, "kafka topic", KafkaError.UNKNOWN_TOPIC_OR_PART, removed, absent, timeout)
    return removed, absent


def _settle(futures: dict[str, Any], what: str, absent_code: int, removed: list[str],
            absent: list[str], timeout: float, busy: int | None = None) -> None:
    """Wait for Kafka's answer to each deletion and note it: done, or absent (*absent_code*
    is the error of a name that does not exist); a *busy* group, or any other error,
    raises TaskLogError naming it."""
    for name, future in futures.items():
        try:
            future.result(timeout)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            code = error.code() if isinstance(error, KafkaError) else None
            if code == absent_code:
                absent.append(f"{what} {name}")
                continue
            if code is not None and code == busy:
                raise TaskLogError(f"{what} {name} still has members: stop the dispatchers of "
                                   "this environment first") from exc
            raise TaskLogError(f"Kafka could not delete {what} {name}: {exc}") from exc
        removed.append(f"{what} {name}")
