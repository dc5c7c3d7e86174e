"""``schedule_many`` against real Kafka, and through a real dispatcher and Celery worker."""

from __future__ import annotations

import datetime as dt
import math
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest

from celery_scheduler.client import SchedulerClient, set_client
from celery_scheduler.config import get_settings
from celery_scheduler.decoding import decode
from celery_scheduler.envelope import ScheduleEnvelope
from celery_scheduler.errors import NotSerializableError, TaskLogUnavailableError
from celery_scheduler.keys import TaskKey
from celery_scheduler.partitioner import partition_for
from celery_scheduler.store.base import State
from tests.integration.dispatch_fixtures import Scheduler
from tests.integration.raw_topic import PARTITIONS, read_topic
from tests.integration.test_dispatch import check_order_and_no_overlap
from tests.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.cassandra, pytest.mark.redis]
UTC = dt.timezone.utc


@pytest.fixture
def unreachable(schedule: Any) -> Iterator[Any]:
    """The test app's tasks, producing to a Kafka nobody listens on (1 s delivery timeout)."""
    app = schedule.app
    settings = get_settings(app).replace(kafka_bootstrap_servers="127.0.0.1:1",
                                         kafka_produce_timeout=1.0)
    client = SchedulerClient(settings)
    client.task_log._partitions = PARTITIONS  # no metadata to ask for: records go straight in
    previous = set_client(app, client)
    yield schedule
    set_client(app, previous)
    client.task_log._closed.set()


def test_each_call_lands_in_its_ordering_ids_partition_in_order_as_schedule_writes_it(
        scheduler: Scheduler, schedule: Any, kafka_bootstrap: str) -> None:
    when = dt.datetime.now(UTC).replace(microsecond=0) + dt.timedelta(days=3)
    calls = [(when + dt.timedelta(seconds=i % 7), (f"o{i % 50}", i),
              {"duration": 0.0, "scheduled_for": float(i)}) for i in range(3000)]
    # a batch whose last call is refused publishes none of its calls (read below: the topic
    # then holds only the good batch's)
    refused = [(at, (ordering_id, seq + 10_000), kwargs) for at, (ordering_id, seq), kwargs
               in calls] + [(when, ("o1", 99_999), {"duration": math.inf})]
    with pytest.raises(NotSerializableError, match="call 3000 of the batch"):
        schedule.record.schedule_many(refused)
    batch = schedule.record.schedule_many(calls)
    assert batch.done() and batch.failed() == [] and batch.count == 3000

    records = read_topic(kafka_bootstrap, scheduler.env["CELERY_SCHEDULER_TEST_TOPIC"], 3000)
    assert sum(map(len, records.values())) == 3000
    client = schedule.record.client
    by_key: dict[TaskKey, ScheduleEnvelope] = {}
    for partition, values in records.items():
        seqs: dict[str, list[int]] = defaultdict(list)
        for value in values:
            envelope = decode(value)
            assert isinstance(envelope, ScheduleEnvelope)
            assert partition == partition_for(envelope.key.ordering_id, PARTITIONS)
            seqs[envelope.key.ordering_id].append(envelope.args[1])
            by_key[envelope.key] = envelope
        for ordering_id, seen in seqs.items():  # each ordering id's calls in the batch's order
            assert seen == sorted(seen), ordering_id
    assert set(by_key) == set(batch.keys)  # every call, once
    for (at, args, kwargs), key in zip(calls[:100], batch.keys, strict=False):
        expected = schedule.record.build(args, kwargs, at=at, client=client)
        got = by_key[key]
        assert got.as_json() | {"enqueued_at": 0} == expected.as_json() | {"enqueued_at": 0}


def test_calls_kafka_never_acknowledges_are_reported_by_key(unreachable: Any) -> None:
    when = dt.datetime.now(UTC) + dt.timedelta(days=1)
    calls = [(when, (f"o{i}", i)) for i in range(20)]
    started = time.monotonic()
    with pytest.raises(TaskLogUnavailableError, match=r"20 of 20 record\(s\) of a batch were not"):
        unreachable.record.schedule_many(calls)
    assert time.monotonic() - started < 30
    batch = unreachable.record.schedule_many(calls, wait=False)
    with pytest.raises(TaskLogUnavailableError, match="make the same call again"):
        batch.wait(15)
    assert sorted(batch.failed()) == sorted(batch.keys)


def test_a_batch_runs_on_time_in_order_per_ordering_id(scheduler: Scheduler, schedule: Any) -> None:
    scheduler.dispatcher()
    scheduler.worker()
    start = time.time() + 4
    calls = [(dt.datetime.fromtimestamp(start + seq * 0.3, UTC), (ordering_id, seq),
              {"duration": 0.02, "scheduled_for": start + seq * 0.3})
             for seq in range(5) for ordering_id in ("alice", "bob", "carol")]
    batch = schedule.record.schedule_many(calls)

    scheduler.wait_for_starts(15, timeout=60)
    assert check_order_and_no_overlap(scheduler) == {name: [0, 1, 2, 3, 4]
                                                     for name in ("alice", "bob", "carol")}
    lateness = [s["t"] - s["scheduled_for"] for s in scheduler.starts()]
    assert min(lateness) >= 0, "a task ran before its time"
    assert max(lateness) < 1.0, f"lateness {max(lateness):.3f}s"
    store = schedule.record.client.store

    def states() -> list[Any]:
        return [getattr(store.status(key), "state", None) for key in batch.keys]

    wait_until(lambda: all(state is State.SUCCEEDED for state in states()), 20, states)


def test_a_hot_ordering_id_runs_in_order_and_does_not_hold_the_others_back(
        scheduler: Scheduler, schedule: Any) -> None:
    """150 tasks of one ordering id in one call: a batch reads them all, writes a few rounds
    of them, and carries the rest to later batches (carrying.py); the other ordering ids'
    tasks, read after them, run on time."""
    dispatcher = scheduler.dispatcher()
    scheduler.worker()
    start = time.time() + 5
    hot = [(dt.datetime.fromtimestamp(start + seq * 0.02, UTC), ("hot", seq),
            {"duration": 0.0, "scheduled_for": start + seq * 0.02}) for seq in range(150)]
    others = [(dt.datetime.fromtimestamp(start + 1, UTC), (f"other-{n}", 0),
               {"duration": 0.0, "scheduled_for": start + 1}) for n in range(20)]
    schedule.record.schedule_many(hot + others)

    scheduler.wait_for_starts(170, timeout=90)
    order = check_order_and_no_overlap(scheduler)
    assert order["hot"] == list(range(150))
    lateness = [s["t"] - s["scheduled_for"] for s in scheduler.starts()
                if s["o"] != "hot"]
    assert len(lateness) == 20 and max(lateness) < 1.5, lateness
    scheduler.wait_for_log(dispatcher, "carrying ")  # the hot id's records were carried
    scheduler.wait_for_log(dispatcher, "the records carried to later batches are all written")
