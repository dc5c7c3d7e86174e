"""The names ``scheduler drop`` deletes, and a store's drop_schema."""

from __future__ import annotations

from celery_scheduler.config import Settings
from celery_scheduler.envelope import ScheduleEnvelope
from celery_scheduler.environment import environment
from celery_scheduler.keys import TaskKey
from celery_scheduler.store.memory import MemoryScheduleStore


def test_the_environment_is_every_name_the_topic_makes() -> None:
    names = environment(Settings(kafka_topic="ci_42", cassandra_keyspace="ci_ks"))
    assert names.topics == ("ci_42", "ci_42.deadletter", "ci_42.outcomes")
    assert names.groups == ("ci_42.dispatchers", "ci_42.dispatchers.outcomes")
    assert names.keyspace == "ci_ks"
    assert environment(Settings(kafka_topic="t"), group="mine").groups == ("mine", "mine.outcomes")


def test_a_dropped_store_holds_nothing_and_says_whether_it_held_anything() -> None:
    store = MemoryScheduleStore()
    envelope = ScheduleEnvelope(TaskKey("o1", 1_000, "u"), "proj.remind")
    store.put(0, envelope, now_ms=0)
    assert store.status(envelope.key) is not None
    assert store.drop_schema() is True
    assert store.status(envelope.key) is None and store.backlog(0) == (0, None)
    assert store.drop_schema() is False
