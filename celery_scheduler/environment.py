"""One environment's scheduler: its topics, consumer groups and keyspace, made and dropped.

:func:`create` is ``celery -A proj scheduler init``: the scheduler topic with its
dead-letter and outcomes topics, and the Cassandra keyspace and tables (idempotent).
:func:`drop` is ``celery -A proj scheduler drop``, for test and CI environments, which make a
topic and keyspace of their own per run and must not leave them behind: those topics, the
dispatchers' consumer groups (offsets) and the keyspace, with everything in them (pending
tasks, statuses, dead letters). Dropping what does not exist is not an error, so a teardown
can run after a set-up that failed half-way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from celery_scheduler.config import Settings
from celery_scheduler.errors import ConfigurationError
from celery_scheduler.tasklog.topics import (
    dead_letter_topic,
    dispatcher_group,
    outcome_group,
    outcome_topic,
)

__all__ = ["Dropped", "Environment", "create", "drop", "environment"]

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
    group = group or dispatcher_group(topic)
    return Environment((topic, dead_letter_topic(topic), outcome_topic(topic)),
                       (group, outcome_group(group)), settings.cassandra_keyspace)


def create(settings: Settings, partitions: int | None = None,
           replication_factor: int | None = None, say: Callable[[str], None] = print) -> None:
    """Create the topics and the keyspace of *settings* where missing, saying each step.

    *partitions* and *replication_factor* are those of new topics (default: the settings').
    The outcomes topic must have as many partitions as the scheduler topic:
    :class:`~celery_scheduler.errors.ConfigurationError` says how to fix one that has not.
    """
    from celery_scheduler.store import open_store
    from celery_scheduler.tasklog.admin import partitions_of
    from celery_scheduler.tasklog.kafka import create_topic

    s = settings
    names = environment(s)
    replication = replication_factor or s.kafka_replication_factor

    topic, dead, outcomes = names.topics
    created = create_topic(s.kafka_bootstrap_servers, s.kafka_options, topic,
                           partitions or s.kafka_partitions, replication)
    count = partitions_of(s, topic, created)
    say(f"kafka topic {topic}: {'created' if created else 'exists'}, {count} partitions")
    created = create_topic(s.kafka_bootstrap_servers, s.kafka_options, dead, 1, replication)
    say(f"kafka topic {dead}: {'created' if created else 'exists'}")
    # one outcomes partition for each partition of the topic, numbered alike
    created = create_topic(s.kafka_bootstrap_servers, s.kafka_options, outcomes, count,
                           replication)
    outcome_count = partitions_of(s, outcomes, created)
    if outcome_count != count:
        raise ConfigurationError(
            f"Kafka topic {outcomes!r} has {outcome_count} partitions but {topic!r} has {count}: "
            f"they must match; add partitions to {outcomes!r} (kafka-topics --alter "
            "--partitions) to match")
    say(f"kafka topic {outcomes}: {'created' if created else 'exists'}, {outcome_count} partitions")
    with open_store(s) as store:
        moved = store.create_schema(status_shards=count)
    if moved:
        say(f"cassandra keyspace {names.keyspace}: moved {moved} task statuses from "
            "task_status, as earlier versions kept them, to key_status")
    say(f"cassandra keyspace {names.keyspace}: schema ready")


def drop(settings: Settings, group: str | None = None, timeout: float = 30.0) -> Dropped:
    """Delete the environment of *settings*: its Kafka topics and groups, then its keyspace.

    Raises :class:`~celery_scheduler.errors.TaskLogError` when a group still has members
    (stop the dispatchers first) or Kafka refuses a deletion, before the keyspace is touched.
    """
    from celery_scheduler.store import open_store
    from celery_scheduler.tasklog.admin import delete

    names = environment(settings, group)
    removed, absent = delete(settings, names.groups, names.topics, timeout)
    dropped = Dropped(removed, absent)
    with open_store(settings) as store:
        existed = store.drop_schema()
    (dropped.removed if existed else dropped.absent).append(f"cassandra keyspace {names.keyspace}")
    return dropped
