"""Partition migration: move every task a deployment still holds to a topic with another
partition count.

A topic's partition count cannot change in place: an ordering id's partition is
``murmur2(ordering id) % count``, and the schedule's rows are keyed by partition. So a
deployment that needs more (or fewer) partitions moves to a new topic and keyspace:

1. stop the old topic's dispatchers (SIGTERM), and wait until no task is ``released``;
2. ``init`` the new topic and keyspace (another ``scheduler_kafka_topic`` and
   ``scheduler_cassandra_keyspace``) with the new partition count;
3. run this job: it reads every row of the old schedule (pending, waiting for a retry, or
   blocked) and produces its task to the new topic, keyed by ordering id into the partition
   a schedule call would choose, in schedule order per ordering id;
4. start the new topic's dispatchers, and switch the producers' settings to it.

Schedule calls made between 1 and 4 with the old settings land in the old topic: switch the
producers before step 3, or run the job again after (the task keys make it idempotent).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from celery_scheduler.config import Settings
from celery_scheduler.partitioner import partition_for
from celery_scheduler.signing import HEADER as SIGNATURE_HEADER
from celery_scheduler.spark.topic import record_fields, write_records

__all__ = ["MigrationResult", "migrate"]


@dataclass(frozen=True)
class MigrationResult:
    moved: int  # tasks produced to the new topic
    partitions: int  # the new topic's partition count


def _records(settings: Settings, partitions: int, rows: Iterator[Any]) -> Iterator[tuple[Any, ...]]:
    signer = settings.signer
    for row in rows:
        key = row["ordering_id"].encode("utf-8")
        value = bytes(row["envelope"])
        headers = [(SIGNATURE_HEADER, signer.sign(key, value))] if signer is not None else None
        yield key, value, partition_for(row["ordering_id"], partitions), headers


def migrate(spark: Any, source: Settings, target: Settings, *,
            cassandra_host: str | None = None) -> MigrationResult:
    """Produce every task of *source*'s schedule to *target*'s topic; see the module's steps."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    from celery_scheduler.tasklog.kafka import KafkaTaskLog

    if (source.kafka_topic, source.cassandra_keyspace) == (target.kafka_topic,
                                                           target.cassandra_keyspace):
        raise ValueError("the target must be another topic and keyspace than the source")
    log = KafkaTaskLog(target.kafka_bootstrap_servers, target.kafka_topic,
                       timeout=target.kafka_produce_timeout, options=target.kafka_options)
    try:
        partitions = log.partitions()  # also fails clearly if init was not run
    finally:
        log.close()
    host = cassandra_host or source.cassandra_contact_points[0]
    rows = (spark.read.format("org.apache.spark.sql.cassandra")
            .option("spark.cassandra.connection.host", host)
            .option("spark.cassandra.connection.port", str(source.cassandra_port))
            .options(keyspace=source.cassandra_keyspace, table="schedule").load()
            .filter(F.col("envelope").isNotNull())  # not a row a finished dispatch update left
            # one writer per ordering id, in schedule order: its order in the new partition
            .repartition("ordering_id")
            .sortWithinPartitions("ordering_id", "at", "unique_key")
            .select("ordering_id", "envelope"))
    out = spark.createDataFrame(rows.rdd.mapPartitions(
        lambda part: _records(target, partitions, part), preservesPartitioning=True),
        StructType(record_fields())).persist()
    try:
        write_records(out, target)
        return MigrationResult(out.count(), partitions)
    finally:
        out.unpersist()
