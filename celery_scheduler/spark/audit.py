"""The loss audit: every task the topic accepted, checked against what Cassandra knows of it.

The scheduler topic holds every schedule and cancel record Kafka acknowledged (as far back
as the topic's retention). A key whose last record is a schedule call must have a status:
pending, released, succeeded, failed or cancelled (a cancel that came too late). A key with
none, or whose status says nothing ran it, was lost somewhere between the topic and the
store: this job lists them, an independent check of "at least once". It lists too the keys
the store shows released more than once (retries, or re-releases after a lease ended).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from celery_scheduler.config import Settings
from celery_scheduler.decoding import decode
from celery_scheduler.envelope import CancelEnvelope, RetryEnvelope
from celery_scheduler.errors import EnvelopeDecodeError
from celery_scheduler.store.base import State

__all__ = ["AuditResult", "audit"]

# States that account for a scheduled key.
ACCOUNTED = tuple(state.value for state in State)


@dataclass
class AuditResult:
    """Keys scheduled in the topic, and those the store cannot account for."""

    scheduled: int  # keys whose last record in the topic is a schedule call
    cancelled: int  # keys whose last record is a cancel
    missing_count: int
    missing: Any  # DataFrame: ordering_id, at (epoch ms), unique_key, partition, offset, state
    repeated_count: int
    repeated: Any  # DataFrame: keys released more than once (state, attempts)

    def __repr__(self) -> str:
        return (f"<AuditResult scheduled={self.scheduled} cancelled={self.cancelled} "
                f"missing={self.missing_count} released-more-than-once={self.repeated_count}>")


def _keys(rows: Iterator[Any]) -> Iterator[tuple[Any, ...]]:
    for row in rows:
        try:
            envelope = decode(row["value"])
        except EnvelopeDecodeError:
            continue  # a dead letter: not accepted by a dispatcher, not the audit's concern
        if isinstance(envelope, RetryEnvelope):
            continue  # an operator's retry of a key whose schedule record is counted
        key = envelope.key
        yield (key.ordering_id, key.scheduled_ms, key.uniqueness_key, row["partition"],
               row["offset"], isinstance(envelope, CancelEnvelope))


def audit(spark: Any, settings: Settings, cassandra_host: str | None = None) -> AuditResult:
    """Read the topic from its earliest records and the status table, and compare them."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from pyspark.sql.types import (
        BooleanType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    records = (spark.read.format("kafka")
               .option("kafka.bootstrap.servers", settings.kafka_bootstrap_servers)
               .options(**{f"kafka.{k}": str(v) for k, v in settings.kafka_options.items()})
               .option("subscribe", settings.kafka_topic)
               .option("startingOffsets", "earliest").option("endingOffsets", "latest").load())
    schema = StructType([
        StructField("ordering_id", StringType()), StructField("at", LongType()),
        StructField("unique_key", StringType()), StructField("partition", IntegerType()),
        StructField("offset", LongType()), StructField("cancel", BooleanType())])
    keys = spark.createDataFrame(records.select("value", "partition", "offset").rdd
                                 .mapPartitions(_keys), schema)
    # a key's records share a partition: the last by offset says whether it stands
    last = Window.partitionBy("ordering_id", "at", "unique_key").orderBy(F.col("offset").desc())
    latest = (keys.withColumn("n", F.row_number().over(last)).filter("n = 1").drop("n")
              .persist())
    host = cassandra_host or settings.cassandra_contact_points[0]
    status = (spark.read.format("org.apache.spark.sql.cassandra")
              .option("spark.cassandra.connection.host", host)
              .option("spark.cassandra.connection.port", str(settings.cassandra_port))
              .options(keyspace=settings.cassandra_keyspace, table="key_status").load()
              .select("ordering_id", (F.unix_millis(F.col("at"))).alias("at"), "unique_key",
                      "state", "attempts"))
    scheduled = latest.filter(~F.col("cancel"))
    joined = scheduled.join(status, ["ordering_id", "at", "unique_key"], "left")
    missing = (joined.filter(F.col("state").isNull() | ~F.col("state").isin(*ACCOUNTED))
               .select("ordering_id", "at", "unique_key", "partition", "offset", "state")
               .localCheckpoint())
    repeated = (joined.filter(F.col("attempts") > 1)
                .select("ordering_id", "at", "unique_key", "state", "attempts").localCheckpoint())
    try:
        return AuditResult(scheduled.count(), latest.filter(F.col("cancel")).count(),
                           missing.count(), missing, repeated.count(), repeated)
    finally:
        latest.unpersist()
