"""Bulk scheduling on local Spark against the real Kafka, a dispatcher and a worker.

100,000 rows, some of them invalid: exactly the valid ones reach the topic, each in the
partition a schedule call would choose; the invalid ones come back with their reasons; a
sample due now runs through the dispatcher and worker, once, even after a second run.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from celery_scheduler.decoding import decode
from celery_scheduler.keys import to_epoch_ms
from celery_scheduler.partitioner import partition_for
from tests.integration.dispatch_fixtures import Scheduler
from tests.integration.raw_topic import read_topic
from tests.services import drop_scheduler
from tests.waiting import wait_until

# the Spark modules on one test process, one after the other: one Spark JVM at a time
pytestmark = [pytest.mark.kafka, pytest.mark.cassandra, pytest.mark.redis, pytest.mark.xdist_group("spark"),
              # PySpark's gateway leaves sockets to the JVM for the garbage collector
              pytest.mark.filterwarnings("ignore::ResourceWarning"),
              pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")]
UTC = dt.timezone.utc
PARTITIONS = 6  # tests.apps.dispatching's default
ROWS = 20_000
SAMPLE = 20  # due a few seconds after the job, to run through a dispatcher and a worker


def test_a_dataframe_is_scheduled_row_by_row_with_refused_rows_kept(
        spark: Any, scheduler: Scheduler, schedule: Callable[..., Any], kafka_bootstrap: str) -> None:
    from celery_scheduler.spark import schedule_dataframe

    now = dt.datetime.now(UTC).replace(microsecond=0)
    # soon: due while the job runs again (a time up to scheduler_grace_seconds past is taken)
    soon, later = now + dt.timedelta(seconds=10), now + dt.timedelta(days=1, microseconds=250)
    rows = []
    for n in range(ROWS):
        ordering_id, when = f"bulk-{n % 5000}", (soon if n < SAMPLE else later)
        if n % 1000 == 999:
            ordering_id = ""  # no ordering id: InvalidKeyError
        elif n % 1000 == 998:
            when = now - dt.timedelta(days=1)  # long past: ScheduleTimeError
        rows.append((ordering_id, n, when.replace(tzinfo=None), when.timestamp()))
    df = spark.createDataFrame(rows, "customer string, seq long, due timestamp, due_s double")

    started = time.monotonic()
    result = schedule_dataframe(df, schedule.record, at="due", args=["customer", "seq"],
                                kwargs={"scheduled_for": "due_s"})
    took = time.monotonic() - started
    invalid = ROWS // 1000 * 2
    print(f"{ROWS} rows bulk-scheduled in {took:.1f}s ({ROWS / took:.0f} rows/s)")
    assert (result.accepted, result.rejected_count) == (ROWS - invalid, invalid)
    reasons = Counter(row["error_type"] for row in result.rejected.collect())
    assert reasons == {"InvalidKeyError": ROWS // 1000, "ScheduleTimeError": ROWS // 1000}
    [example] = result.rejected.filter("error_type = 'InvalidKeyError'").limit(1).collect()
    assert "ordering id must not be empty" in example["error"] and '"seq": 999' in example["row"]

    # exactly the valid rows, each in the partition schedule_at would choose
    topic = scheduler.env["CELERY_SCHEDULER_TEST_TOPIC"]
    found = read_topic(kafka_bootstrap, topic, ROWS - invalid)
    assert sum(map(len, found.values())) == ROWS - invalid
    seqs = set()
    for partition, values in found.items():
        for value in values[:: max(1, len(values) // 200)]:  # a sample of each partition
            envelope = decode(value)
            assert partition == partition_for(envelope.key.ordering_id, PARTITIONS)
        seqs.update(decode(value).args[1] for value in values)
    # Spark reads the timestamp to the microsecond and rounds it up as schedule_at does
    envelopes = [decode(value) for values in found.values() for value in values]
    later_keys = {envelope.key.scheduled_ms for envelope in envelopes if envelope.args[1] >= SAMPLE}
    assert later_keys == {to_epoch_ms(later, UTC)} == {int(now.timestamp()) * 1000 + 86_400_001}
    assert seqs == {n for n in range(ROWS) if n % 1000 < 998}

    # the sample due now runs, once, though the job runs again
    again = schedule_dataframe(df.filter(f"seq < {SAMPLE}"), schedule.record, at="due",
                               args=["customer", "seq"], kwargs={"scheduled_for": "due_s"})
    assert (again.accepted, again.rejected_count) == (SAMPLE, 0)
    scheduler.dispatcher()
    scheduler.worker()
    scheduler.wait_for_starts(SAMPLE, timeout=120)
    # a task due after the sample: once it started, a second copy of a sample task, due
    # with the first, would have started before it (one worker, taking its queue in order)
    schedule.record.schedule_at(dt.datetime.now(UTC) + dt.timedelta(seconds=0.5), "marker", 0)
    scheduler.wait_for_starts(SAMPLE + 1, timeout=60)
    starts = [s for s in scheduler.starts() if s["o"] != "marker"]
    assert sorted(s["seq"] for s in starts) == list(range(SAMPLE))


def test_the_cli_schedules_a_csv_file_and_writes_the_refused_rows(
        scheduler: Scheduler, tmp_path: Any) -> None:
    due = (dt.datetime.now(UTC) + dt.timedelta(days=1)).strftime("%Y-%m-%d %H:%M:%S")
    source = tmp_path / "reminders.csv"
    source.write_text("customer,seq,due\n" + "".join(f"c{n},{n},{due}\n" for n in range(50))
                      + f",50,{due}\nc51,51,not a time\n")
    refused = tmp_path / "refused"
    done = scheduler.cli("spark", "schedule", str(source), "--format", "csv", "--task",
                         "dispatching.record", "--at", "due", "--arg", "customer", "--arg", "seq",
                         "--rejected", str(refused), "--master", "local[1]", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"scheduled 50 row(s), refused 2 (written to {refused})" in done.stdout
    lines = [line for part in refused.glob("part-*.json") for line in part.read_text().splitlines()]
    assert sorted(json.loads(line)["error_type"] for line in lines) == [
        "InvalidKeyError", "ScheduleTimeError"]


def test_the_audit_finds_accepted_tasks_the_store_lost(
        spark: Any, scheduler: Scheduler, schedule: Callable[..., Any]) -> None:
    from celery_scheduler.spark import audit

    scheduler.dispatcher()
    later = dt.datetime.now(UTC).replace(microsecond=0) + dt.timedelta(days=1)
    handles = [schedule.record.schedule_at(later, f"audit-{n % 7}", n) for n in range(30)]
    for handle in handles[:3]:
        handle.cancel()
    store = schedule.record.client.store
    deadline = time.monotonic() + 60
    while any(h.status() is None for h in handles) or any(
            h.status().state.value != "cancelled" for h in handles[:3]):
        assert time.monotonic() < deadline, "the dispatcher did not store every call"
        time.sleep(0.5)
    lost = handles[10:14]
    for handle in lost:  # as if a write had never reached Cassandra
        key = handle.key
        store._session.execute(
            f"DELETE FROM {store.keyspace}.key_status WHERE shard = %s AND slot = %s AND at = %s"
            " AND ordering_id = %s AND unique_key = %s", store.layout.primary_key(key))

    found = audit(spark, schedule.record.client.settings)
    assert (found.scheduled, found.cancelled, found.missing_count) == (27, 3, 4)
    missing = {(row["ordering_id"], row["at"], row["unique_key"]) for row in found.missing.collect()}
    assert missing == {(h.key.ordering_id, h.key.scheduled_ms, h.key.uniqueness_key) for h in lost}
    assert found.repeated_count == 0



def test_migration_moves_every_task_to_a_topic_with_another_partition_count(
        spark: Any, scheduler: Scheduler, schedule: Callable[..., Any]) -> None:
    from celery_scheduler.client import SchedulerClient
    from celery_scheduler.spark.migrate import migrate
    from celery_scheduler.store.base import State

    source = schedule.record.client.settings
    old = scheduler.dispatcher()
    now = time.time()
    # due after the old dispatcher stops: only the new topic's may release them
    due = now + 20
    soon = [schedule.record.schedule_at(dt.datetime.fromtimestamp(due + seq, UTC), f"move-{o}",
                                        seq, scheduled_for=due + seq)
            for o in range(5) for seq in range(4)]
    later = [schedule.record.schedule_at(dt.datetime.fromtimestamp(now + 86_400, UTC), f"far-{n}", n)
             for n in range(50)]
    deadline = time.monotonic() + 60
    while any(h.status() is None for h in soon + later):
        assert time.monotonic() < deadline, "the dispatcher did not store every call"
        time.sleep(0.5)
    old.terminate()  # step 1: the old topic's dispatchers stop
    old.wait(timeout=30)
    assert time.time() < due, "the old dispatcher stopped after the first task was due"

    name = scheduler.env["CELERY_SCHEDULER_TEST_TOPIC"] + "_b"
    target = Scheduler({**scheduler.env, "CELERY_SCHEDULER_TEST_TOPIC": name,
                        "CELERY_SCHEDULER_TEST_KEYSPACE": name}, scheduler.execlog, scheduler.tmp)
    try:
        assert target.cli("init", "--partitions", "4").returncode == 0  # step 2
        settings = source.replace(kafka_topic=name, cassandra_keyspace=name)
        moved = migrate(spark, source, settings)  # step 3
        assert (moved.moved, moved.partitions) == (70, 4)
        target.dispatcher()  # step 4
        target.worker()
        target.wait_for_starts(20, timeout=120)
        client = SchedulerClient(settings)
        try:
            # every moved task recorded as succeeded: none can be released again after this
            wait_until(lambda: all(getattr(client.store.status(h.key), "state", None) is State.SUCCEEDED
                                   for h in soon), 60, "every moved task recorded as succeeded")
            statuses = [client.store.status(h.key) for h in later]
        finally:
            client.close()
        starts = target.starts()
        for o in range(5):  # each ran once, in order per ordering id
            assert [s["seq"] for s in starts if s["o"] == f"move-{o}"] == [0, 1, 2, 3]
        assert all(s is not None and s.state is State.PENDING for s in statuses)
        assert {s.partition for s in statuses if s} <= {0, 1, 2, 3}
        assert all(s.partition == partition_for(h.key.ordering_id, 4)
                   for s, h in zip(statuses, later, strict=True) if s)
    finally:
        target.stop_all(kill_workers=True)
        drop_scheduler(name, name)
