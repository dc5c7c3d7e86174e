"""Fuzz the dispatcher's ingest path: any record is either stored or dead-lettered."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from celery_scheduler.dispatcher.engine import Engine
from celery_scheduler.dispatcher.ingest import Ingest
from celery_scheduler.envelope import CancelEnvelope, ScheduleEnvelope, encode
from celery_scheduler.keys import TaskKey
from celery_scheduler.partitioner import partition_for
from celery_scheduler.store.base import Cancel, Put
from celery_scheduler.store.memory import MemoryScheduleStore
from celery_scheduler.tasklog.base import Record
from celery_scheduler.tasklog.dead_letters import DeadLetters
from tests.unit.budget import examples
from tests.unit.fakes import NOW, PARTITIONS, FakeProducer


def ingest() -> tuple[Ingest, FakeProducer, MemoryScheduleStore]:
    store = MemoryScheduleStore()
    producer = FakeProducer()
    engine = Engine(store, lambda task, release: None, "fuzz", clock=lambda: NOW)
    return (Ingest(consumer=None, store=store, engine=engine,  # type: ignore[arg-type]
                   dead_letters=DeadLetters(producer, "t.deadletter"),  # type: ignore[arg-type]
                   partitions=lambda: PARTITIONS, allowed={"proj.remind"}.__contains__,
                   clock=lambda: NOW),
            producer, store)


def valid(ordering_id: str, at: int, cancel: bool) -> bytes:
    key = TaskKey(ordering_id, at, "u")
    return encode(CancelEnvelope(key, NOW) if cancel else ScheduleEnvelope(key, "proj.remind", [1]))


def mutate(data: bytes, path: str, value: Any) -> bytes:
    document = json.loads(data)
    if path in document:
        document[path] = value
    return json.dumps(document).encode()


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)

records = st.one_of(
    st.tuples(st.binary(max_size=64), st.binary(max_size=300)),
    st.builds(lambda o, at, cancel, field, value: (o.encode(), mutate(valid(o, at, cancel), field, value)),
              st.text(min_size=1, max_size=8), st.integers(0, 2**43), st.booleans(),
              st.sampled_from(["v", "type", "task", "key", "args", "kwargs", "options", "retry",
                               "enqueued_at", "none"]), json_values),
    st.builds(lambda o, at, cancel: (o.encode(), valid(o, at, cancel)),
              st.text(min_size=1, max_size=8).filter(lambda o: "\x00" not in o),
              st.integers(0, 2**43), st.booleans()),
)


@settings(max_examples=examples(1500), deadline=None)
@given(st.lists(st.tuples(records, st.integers(0, PARTITIONS - 1), st.booleans()), max_size=20))
def test_every_record_is_stored_or_dead_lettered_never_an_exception(batch: list[Any]) -> None:
    runner, producer, store = ingest()
    accepted = []
    for offset, ((key, value), partition, right_partition) in enumerate(batch):
        if right_partition:
            partition = partition_for(key, PARTITIONS)
        envelope = runner._check(Record("t", partition, offset, key, value))
        if envelope is not None:
            accepted.append(envelope)
            op = Cancel(partition, envelope.key) if isinstance(envelope, CancelEnvelope) else Put(
                partition, envelope)
            runner.apply([op])
    # nothing dropped silently: each record was accepted or dead-lettered with a reason
    assert len(accepted) + len(producer.produced) == len(batch)
    assert all(record.header("reason") for record in producer.produced)
    # and every accepted schedule record reached the store
    for envelope in accepted:
        if isinstance(envelope, ScheduleEnvelope):
            assert store.status(envelope.key) is not None


def test_the_fuzzed_path_accepts_good_records_and_stores_them() -> None:
    runner, producer, store = ingest()
    good = Record("t", partition_for(b"acct", PARTITIONS), 0, b"acct", valid("acct", 5, False))
    wrong_partition = Record("t", (good.partition + 1) % PARTITIONS, 1, b"acct", valid("acct", 6, False))
    envelope = runner._check(good)
    assert isinstance(envelope, ScheduleEnvelope)
    runner.apply([Put(good.partition, envelope)])
    assert store.status(envelope.key) is not None
    assert runner._check(wrong_partition) is None
    assert b"belongs in partition" in (producer.produced[0].header("reason") or b"")


def test_records_over_the_size_limit_are_dead_lettered() -> None:
    runner, producer, _ = ingest()
    runner.admission = dataclasses.replace(runner.admission, max_bytes=200)
    value = encode(ScheduleEnvelope(TaskKey("acct", 5, "u"), "proj.remind", ["x" * 300]))
    record = Record("t", partition_for(b"acct", PARTITIONS), 0, b"acct", value)
    assert runner._check(record) is None
    assert b"over the limit of 200" in (producer.produced[0].header("reason") or b"")
