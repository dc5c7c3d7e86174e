"""Bulk scheduling: every row of a DataFrame becomes a schedule call, validated and encoded by
the same code as ``task.schedule(...)``, and written to the scheduler topic by Spark's Kafka
sink into the partition a schedule call would choose (Kafka's Java murmur2 partitioner),
with ``acks=all`` and idempotence.

Rows a schedule call would refuse go to ``BulkResult.rejected`` with the error's type and
message; none is dropped silently. Running the same job again schedules the same task keys,
which run once.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from celery_scheduler.api import ScheduledTask, as_scheduled
from celery_scheduler.client import SchedulerClient, get_client
from celery_scheduler.config import Settings
from celery_scheduler.errors import ScheduleError, SchedulerError, ScheduleTimeError
from celery_scheduler.partitioner import partition_for
from celery_scheduler.signing import HEADER as SIGNATURE_HEADER
from celery_scheduler.spark.topic import record_fields, write_records

__all__ = ["BulkResult", "schedule_dataframe"]

# Columns of the intermediate result: the record for the topic, or why the row was refused.
_ROW, _ERROR_TYPE, _ERROR = "row", "error_type", "error"
# The at= column as epoch microseconds, computed by Spark: a timestamp read in Python would
# be in the executor's local time zone. Python then rounds it to the millisecond as
# schedule_at() does, so both paths give one time the same key.
_AT_US = "__celery_scheduler_at_us"
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)

Columns = str | Sequence[str] | Mapping[str, str] | None


@dataclass
class BulkResult:
    """What a bulk job did: how many rows it scheduled, and the rows it refused, with why."""

    accepted: int
    rejected_count: int
    rejected: Any  # a DataFrame: row (the input row as JSON), error_type, error

    def __repr__(self) -> str:
        return f"<BulkResult accepted={self.accepted} rejected={self.rejected_count}>"


@dataclass(frozen=True)
class _Plan:
    """What each executor needs to turn a row into a record (it is pickled to them)."""

    task: ScheduledTask[..., Any]
    settings: Settings
    partitions: int
    at: str
    args: Columns
    kwargs: Columns
    ordering_id: str | None
    uniqueness_key: str | None
    options: str | None


def _values(row: Mapping[str, Any], columns: Columns, positional: bool) -> Any:
    if columns is None:
        return [] if positional else {}
    if isinstance(columns, str):  # one column holds them all: an array, or a struct/map
        value = row[columns]
        if value is None:
            return [] if positional else {}
        return _plain(value)
    if isinstance(columns, Mapping):
        return {name: _plain(row[column]) for name, column in columns.items()}
    return [_plain(row[column]) for column in columns]


def _plain(value: Any) -> Any:
    """Spark's Row and its nested values as the plain Python values a task call takes."""
    if hasattr(value, "asDict"):
        return {name: _plain(item) for name, item in value.asDict().items()}
    if isinstance(value, dict):
        return {name: _plain(item) for name, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def _records(plan: _Plan, rows: Iterator[Any]) -> Iterator[tuple[Any, ...]]:
    client = SchedulerClient(plan.settings)  # only encodes: it never connects
    signer = plan.settings.signer
    for spark_row in rows:
        row = spark_row.asDict()
        at_us = row.pop(_AT_US)
        try:
            if at_us is None:
                raise ScheduleTimeError(f"{plan.at} = {row[plan.at]!r} is not a time")
            at = _EPOCH + dt.timedelta(microseconds=at_us)
            options = _values(row, plan.options, positional=False) if plan.options else {}
            envelope = plan.task.build(
                _values(row, plan.args, positional=True), _values(row, plan.kwargs, positional=False),
                at=at, ordering_id=row[plan.ordering_id] if plan.ordering_id else None,
                uniqueness_key=row[plan.uniqueness_key] if plan.uniqueness_key else None,
                options=options, client=client)
            data = client.encode(envelope)
        except SchedulerError as exc:
            yield (None, None, None, None, _shown(row), type(exc).__name__, str(exc))
            continue
        except (KeyError, TypeError, ValueError) as exc:  # a column missing, a value unusable
            yield (None, None, None, None, _shown(row), type(exc).__name__, str(exc))
            continue
        key = envelope.key.ordering_id.encode("utf-8")
        headers = ([(SIGNATURE_HEADER, signer.sign(key, data))] if signer is not None else None)
        yield (key, data, partition_for(envelope.key.ordering_id, plan.partitions), headers,
               None, None, None)


def _shown(row: Mapping[str, Any]) -> str:
    return json.dumps(row, default=str, ensure_ascii=False, sort_keys=True)


def schedule_dataframe(df: Any, task: Any, *, at: str, args: Columns = None, kwargs: Columns = None,
                       ordering_id: str | None = None, uniqueness_key: str | None = None,
                       options: str | None = None, app: Any = None) -> BulkResult:
    """Schedule ``task`` once for every row of *df*; each parameter names columns.

    *at* names a timestamp column (read in UTC). *args* names a column holding the list of
    positional arguments, or is a list of columns, one per argument; *kwargs* names a column
    holding a struct or map, or maps parameter names to columns. *ordering_id* and
    *uniqueness_key* name columns that override the decorator's; *options* names a column of
    Celery options. Records go to the app's scheduler topic; the call returns once Kafka
    acknowledged all of them.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    scheduled = as_scheduled(task)
    client = get_client(app or scheduled.task._get_app())
    settings = client.settings
    partitions = client.task_log.partitions()
    plan = _Plan(scheduled, settings, partitions, at, args, kwargs, ordering_id, uniqueness_key,
                 options)
    if at not in df.columns:
        raise ScheduleError(f"the at= column {at!r} is not in the DataFrame {df.columns}")
    schema = StructType([*record_fields(), StructField(_ROW, StringType()),
                         StructField(_ERROR_TYPE, StringType()), StructField(_ERROR, StringType())])
    timed = df.withColumn(_AT_US, F.unix_micros(F.col(at).cast("timestamp")))
    out = df.sparkSession.createDataFrame(
        timed.rdd.mapPartitions(lambda rows: _records(plan, rows)), schema).persist()
    try:
        good = out.filter(out[_ERROR_TYPE].isNull())
        write_records(good, settings)
        accepted = good.count()
        rejected = out.filter(out[_ERROR_TYPE].isNotNull()).select(_ROW, _ERROR_TYPE, _ERROR)
        return BulkResult(accepted, rejected.count(), rejected.localCheckpoint())
    finally:
        out.unpersist()
