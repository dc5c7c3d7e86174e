"""The store's binder sends the same bytes as cassandra-driver's own ``bind``."""

from __future__ import annotations

import datetime as dt
from collections import namedtuple
from typing import Any

import pytest
from cassandra import cqltypes
from cassandra.query import PreparedStatement

from celery_scheduler.store.binding import Binder
from celery_scheduler.store.cql import FINAL_STATUS, INSERT_ROW, to_timestamp

Column = namedtuple("Column", "keyspace_name table_name name type")
_TYPES = {"int": cqltypes.Int32Type, "bigint": cqltypes.LongType, "timestamp": cqltypes.DateType,
          "text": cqltypes.UTF8Type, "blob": cqltypes.BytesType, "boolean": cqltypes.BooleanType}
NOW = 1_764_340_000_123


def prepared(table: str, columns: list[tuple[str, Any]], routing: list[int]) -> PreparedStatement:
    meta = [Column("ks", table, name, _TYPES.get(kind, kind)) for name, kind in columns]
    return PreparedStatement(meta, b"id", routing, "statement", "ks", 5, [], None)


FINAL = prepared("key_status", [
    ("shard", "int"), ("slot", "bigint"), ("at", "timestamp"), ("ordering_id", "text"),
    ("unique_key", "text"), ("state", "text"), ("task", "text"), ("partition", "int"),
    ("bucket", "bigint"), ("attempts", "int"), ("last_error", "text"), ("updated_at", "timestamp"),
    ("released_at", "timestamp"), ("started_at", "timestamp"), ("finished_at", "timestamp"),
    ("[ttl]", "int")], [0, 1])
ROW = prepared("schedule", [
    ("partition", "int"), ("bucket", "bigint"), ("at", "timestamp"), ("ordering_id", "text"),
    ("unique_key", "text"), ("task", "text"), ("envelope", "blob"), ("attempts", "int"),
    ("blocked", "boolean")], [0, 1])


def same_as_driver(statement: PreparedStatement, values: tuple[Any, ...]) -> None:
    ours = Binder(statement).bind(values)
    theirs = statement.bind(values)
    assert ours.values == theirs.values
    assert ours.routing_key == theirs.routing_key
    assert ours.prepared_statement is statement and ours.keyspace == "ks"


def test_a_finished_status_binds_as_the_driver_binds_it() -> None:
    assert FINAL_STATUS.count("?") == len(FINAL.column_metadata)
    same_as_driver(FINAL, (3, 123456, to_timestamp(NOW), "order-17", "kéy-1", "succeeded", "a.task",
                           4, 29405, 1, None, to_timestamp(NOW), None, to_timestamp(NOW + 7),
                           to_timestamp(NOW + 9), 604800))


def test_a_schedule_row_binds_as_the_driver_binds_it() -> None:
    assert INSERT_ROW.count("?") == 8
    same_as_driver(ROW, (11, 2**40, to_timestamp(NOW), "o", "u", "t", b"\x00\xffenvelope", 0, False))
    same_as_driver(ROW, (11, -5, to_timestamp(NOW), "o", "", "t", b"", 2**31 - 1, True))


def test_timestamps_may_be_milliseconds_or_datetimes_of_any_zone() -> None:
    plus_two = dt.timezone(dt.timedelta(hours=2))
    aware = to_timestamp(NOW).replace(tzinfo=dt.timezone.utc).astimezone(plus_two)
    for at in (NOW, to_timestamp(NOW), aware, dt.datetime(1969, 12, 31, 23, 59, 59, 999000)):
        same_as_driver(ROW, (1, 2, at, "o", "u", "t", b"e", 0, False))
    assert (Binder(ROW).bind((1, 2, NOW, "o", "u", "t", b"e", 0, False)).values
            == Binder(ROW).bind((1, 2, to_timestamp(NOW), "o", "u", "t", b"e", 0, False)).values)


def test_values_of_other_types_go_through_the_drivers_serialiser() -> None:
    # a float timestamp, a bytearray for a blob, an int for a boolean
    same_as_driver(ROW, (1, 2, float(NOW), "o", "u", "t", bytearray(b"env"), 0, 1))
    listed = prepared("key_status", [("shard", "int"), ("slot", "bigint"), ("keys", cqltypes.lookup_casstype(
        "ListType(TupleType(DateType, UTF8Type, UTF8Type))"))], [0, 1])
    same_as_driver(listed, (1, 2, [(to_timestamp(NOW), "o", "u"), (NOW, "p", "v")]))


def test_a_short_value_list_is_left_to_the_driver() -> None:
    same_as_driver(ROW, (1, 2, NOW, "o", "u"))


@pytest.mark.parametrize(("column", "values"), [
    ("partition", (2**31, 2, NOW, "o", "u", "t", b"e", 0, False)),  # int out of range
    ("at", (1, 2, "yesterday", "o", "u", "t", b"e", 0, False)),  # not a time
    ("envelope", (1, 2, NOW, "o", "u", "t", "not bytes", 0, False)),  # text for a blob
])
def test_a_value_the_column_cannot_take_is_a_type_error_naming_the_column(
        column: str, values: tuple[Any, ...]) -> None:
    with pytest.raises(TypeError, match=f"column .{column}."):
        ROW.bind(values)
    with pytest.raises(TypeError, match=f"column '{column}'"):
        Binder(ROW).bind(values)


def test_routing_keys_kept_by_one_binder_are_the_drivers() -> None:
    binder = Binder(ROW)
    for partition, bucket in [(1, 2), (1, 3), (1, 2), (2, 2), (1, 2), (2**31 - 1, -1)]:
        values = (partition, bucket, NOW, "o", "u", "t", b"e", 0, False)
        assert binder.bind(values).routing_key == ROW.bind(values).routing_key
