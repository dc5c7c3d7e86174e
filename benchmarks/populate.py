"""Fill a stack's schedule straight in Cassandra, for scenarios that need far more pending
tasks than ingest through Kafka could deliver in a benchmark's time.

The rows are the ones the store writes for a new task (schedule row, pending status row,
bucket index entry), with envelopes built and encoded by the package itself, partitions
from its own partitioner and buckets from its own bucketing; only the path differs: unlogged
batches of many rows per request instead of one ingest write per task.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterable
from typing import Any

from cassandra.cluster import Cluster
from cassandra.concurrent import execute_concurrent
from cassandra.query import BatchStatement, BatchType

from benchmarks.context import utc
from benchmarks.harness import Stack

__all__ = ["populate"]

ROWS_PER_BATCH = 24
CONCURRENCY = 64


def _ts(ms: int) -> dt.datetime:
    return dt.datetime(1970, 1, 1) + dt.timedelta(milliseconds=ms)


def populate(s: Stack, app: Any, tasks: Iterable[tuple[str, int, float]], seconds: float = 1e9
             ) -> tuple[int, float]:
    """Store (ordering id, seq, due epoch seconds) tasks as pending, stopping after about
    *seconds*; return (tasks stored, tasks/s)."""
    from celery_scheduler.partitioner import partition_for
    from celery_scheduler.store.base import write_bucket
    from celery_scheduler.store.cql import PENDING_STATUS

    client = s._client
    bucket_seconds = client.settings.bucket_seconds
    cluster = Cluster(list(client.settings.cassandra_contact_points), port=client.settings.cassandra_port)
    try:
        session = cluster.connect()
        ks = s.name
        schedule = session.prepare(
            f"INSERT INTO {ks}.schedule (partition, bucket, at, ordering_id, unique_key, task, envelope,"
            " attempts, not_before, lease_until, blocked) VALUES (?, ?, ?, ?, ?, ?, ?, 0, null, null, false)")
        status = session.prepare(PENDING_STATUS.format(ks=ks))
        layout = client.store.layout
        index = session.prepare(f"INSERT INTO {ks}.schedule_buckets (partition, bucket) VALUES (?, ?)")
        started = time.perf_counter()
        now_ms = int(time.time() * 1000)
        indexed: set[tuple[int, int]] = set()
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        batches: list[tuple[BatchStatement, None]] = []
        count = 0

        def send(final: bool = False) -> None:
            nonlocal batch
            if len(batch):
                batches.append((batch, None))
                batch = BatchStatement(batch_type=BatchType.UNLOGGED)
            if batches and (final or len(batches) >= 2000):
                execute_concurrent(session, batches, concurrency=CONCURRENCY, raise_on_first_error=True)
                batches.clear()

        deadline = started + seconds
        for ordering_id, seq, due in tasks:
            if count % 1000 == 0 and time.perf_counter() > deadline:
                break
            envelope = app.record.build((ordering_id, seq, due), {}, at=utc(due))
            key = envelope.key
            partition = partition_for(ordering_id, s.partitions)
            bucket = write_bucket(key.scheduled_ms, now_ms, bucket_seconds)
            at = _ts(key.scheduled_ms)
            batch.add(schedule, (partition, bucket, at, ordering_id, key.uniqueness_key, envelope.task,
                                 client.encode(envelope)))
            batch.add(status, (*layout.primary_key(key), "pending", envelope.task, partition, bucket,
                               0, None, None, 0, _ts(now_ms), 0))
            if (partition, bucket) not in indexed:
                indexed.add((partition, bucket))
                batch.add(index, (partition, bucket))
            count += 1
            if len(batch) >= ROWS_PER_BATCH:
                send()
        send(final=True)
        return count, count / (time.perf_counter() - started)
    finally:
        cluster.shutdown()
