"""Writing records to the scheduler topic from Spark: the Kafka sink, as a schedule call would."""

from __future__ import annotations

from typing import Any

from celery_scheduler.config import Settings

__all__ = ["record_fields", "write_records"]


def record_fields() -> list[Any]:
    """The columns of a record for Spark's Kafka sink: key, value, partition, headers."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        StringType,
        StructField,
        StructType,
    )

    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    return [StructField("key", BinaryType()), StructField("value", BinaryType()),
            StructField("partition", IntegerType()), StructField("headers", ArrayType(header))]


def write_records(records: Any, settings: Settings) -> None:
    """Write *records* to the settings' topic, acks=all and idempotent, signed if they sign."""
    columns = ["key", "value", "partition"] + (["headers"] if settings.signer else [])
    (records.select(*columns).write.format("kafka")
     .option("kafka.bootstrap.servers", settings.kafka_bootstrap_servers)
     .option("topic", settings.kafka_topic)
     .option("kafka.acks", "all").option("kafka.enable.idempotence", "true")
     .options(**{f"kafka.{name}": str(value) for name, value in settings.kafka_options.items()})
     .save())
