"""What ``celery -A proj scheduler drop`` removes: one environment's topics, groups, keyspace.

For test and CI environments, which make a topic and keyspace of their own per run and
must not leave them behind: the scheduler topic with its dead-letter and outcomes topics,
the dispatchers' consumer groups (offsets), and the Cassandra keyspace. Everything in them
is gone: pending tasks, statuses, dead letters. Dropping what does not exist is not an
error, so a teardown can run after a set-up that failed half-way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from celery_scheduler.config import Settings
from celery_scheduler.errors import TaskLogError
from celery_scheduler.operations import DISPATCHER_GROUP_SUFFIX
from celery_scheduler.wire import outcome_topic

__all__ = ["Environment", "drop", "environment"]

DEAD_LETTER_SUFFIX = ".deadletter"  # as dispatcher.ingest.dead_letter_topic names it
OUTCOME_GROUP_SUFFIX = ".outcomes"  # the outcome reader's group, after the dispatchers'


@dataclass(frozen=True)
class Environment:
    """The names one environment's scheduler uses."""

    topics: tuple[str, ...]
    groups: tuple[str, ...]
    keyspace: str


@dataclass
class Dropped:
    """What :func:`drop` removed, and what was not there."""

    removed: list[str] = field(default_factory=list)
    absent: list[str] = field(default_factory=list)


def environment(settings: Settings, group: str | None = None) -> Environment:
    """The topics, consumer groups and keyspace of *settings* (dispatchers in *group*, by
    default ``<topic>.dispatchers`` as ``scheduler dispatch`` uses)."""
    topic = settings.kafka_topic
    group = group or topic + DISPATCHER_GROUP_SUFFIX
    return Environment((topic, topic + DEAD_LETTER_SUFFIX, outcome_topic(topic)),
                       (group, group + OUTCOME_GROUP_SUFFIX), settings.cassandra_keyspace)


def drop(settings: Settings, group: str | None = None, timeout: float = 30.0) -> Dropped:
    """Delete the environment of *settings*: its Kafka topics and groups, then its keyspace.

    Raises :class:`~celery_scheduler.errors.TaskLogError` when a group still has members
    (stop the dispatchers first) or Kafka refuses a deletion, before the keyspace is touched.
    """
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient

    from celery_scheduler.store import open_store
    from celery_scheduler.tasklog.kafka import client_config
    from celery_scheduler.tasklog.reader import kafka_errors

    names = environment(settings, group)
    dropped = Dropped()
    admin = AdminClient(client_config(settings.kafka_bootstrap_servers, settings.kafka_options))
    with kafka_errors("delete the scheduler's consumer groups"):
        groups = admin.delete_consumer_groups(list(names.groups), request_timeout=timeout)
    _settle(groups, "consumer group", KafkaError.GROUP_ID_NOT_FOUND, dropped, timeout,
            busy=KafkaError.NON_EMPTY_GROUP)
    with kafka_errors("delete the scheduler's topics"):
        topics = admin.delete_topics(list(names.topics), operation_timeout=timeout)
    _settle(topics, "kafka topic", KafkaError.UNKNOWN_TOPIC_OR_PART, dropped, timeout)
    with open_store(settings) as store:
        existed = store.drop_schema()
    (dropped.removed if existed else dropped.absent).append(f"cassandra keyspace {names.keyspace}")
    return dropped


def _settle(futures: dict[str, Any], what: str, absent: int, dropped: Dropped, timeout: float,
            busy: int | None = None) -> None:
    """Wait for Kafka's answer to each deletion and note it in *dropped*: done, or *absent*
    (the error code of a name that does not exist); a *busy* group, or any other error,
    raises TaskLogError naming it."""
    from confluent_kafka import KafkaError, KafkaException

    for name, future in futures.items():
        try:
            future.result(timeout)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            code = error.code() if isinstance(error, KafkaError) else None
            if code == absent:
                dropped.absent.append(f"{what} {name}")
                continue
            if code is not None and code == busy:
                raise TaskLogError(f"{what} {name} still has members: stop the dispatchers of "
                                   "this environment first") from exc
            raise TaskLogError(f"Kafka could not delete {what} {name}: {exc}") from exc
        dropped.removed.append(f"{what} {name}")
