"""The Cassandra side's vocabulary: the CQL statements, how rows map to the store's records,
times, and the translation of cassandra-driver's exceptions into the package's errors.

Every statement the store runs more than once is here, so the CQL is in one place (the
schema is in :mod:`celery_scheduler.store.schema`); ``{ks}`` stands for the keyspace.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import functools
from collections.abc import Iterator
from typing import Any

from cassandra import (
    AuthenticationFailed,
    ConsistencyLevel,
    DriverException,
    InvalidRequest,
    OperationTimedOut,
    ReadTimeout,
    Unavailable,
    WriteTimeout,
)
from cassandra.cluster import NoHostAvailable
from cassandra.protocol import ErrorMessage
from cassandra.query import named_tuple_factory

from celery_scheduler.decoding import decode
from celery_scheduler.envelope import ScheduleEnvelope, encode
from celery_scheduler.errors import (
    ConfigurationError,
    EnvelopeDecodeError,
    ScheduleStoreError,
    SchemaMissingError,
    StoreUnavailableError,
)
from celery_scheduler.keys import TaskKey
from celery_scheduler.store.lifecycle import Expiry, RowKind, Transition
from celery_scheduler.store.records import State, TaskStatus
from celery_scheduler.store.status_layout import StatusLayout

__all__ = ["DELETE_ROW", "FINAL_STATUS", "INDEX_BUCKET", "INSERT_ROW", "PENDING_STATUS",
           "SELECT_STATUS", "SELECT_STATUSES", "STATUS_KEY", "Statements", "consistency_level",
           "row_factory", "row_update", "schedule_envelope", "status_of", "status_write", "to_ms",
           "to_timestamp", "transition_statements", "translate_errors"]

# (CQL, parameters) of the writes a store call makes, sent as one batch where they can be.
# A timestamp is written as an int, milliseconds since the epoch (see store.binding).
Statements = list[tuple[str, tuple[Any, ...]]]

_EPOCH = dt.datetime(1970, 1, 1)
# Error codes of the native protocol that say the cluster could not do it now, not that the
# request was wrong: a server error, and 0x1000-0x1FFF (unavailable, overloaded,
# bootstrapping, read or write timeouts and failures, a lightweight transaction's result
# unknown). The driver raises most as its own exceptions; the rest come as a bare ErrorMessage.
SERVER_ERROR = 0x0000
UNAVAILABLE_CODES = range(0x1000, 0x2000)


def to_ms(value: dt.datetime | None) -> int:
    if value is None:
        return 0
    delta = value.replace(tzinfo=None) - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def to_timestamp(ms: int) -> dt.datetime:
    return _EPOCH + dt.timedelta(milliseconds=ms)


@contextlib.contextmanager
def translate_errors(what: str) -> Iterator[None]:
    """Turn cassandra-driver exceptions raised inside the block into ScheduleStoreErrors."""
    try:
        yield
    except NoHostAvailable as exc:
        errors = list((exc.errors or {}).values()) if isinstance(exc.errors, dict) else []
        if errors and all(isinstance(error, AuthenticationFailed) for error in errors):
            # not an outage: waiting or retrying will not change the answer
            raise ScheduleStoreError(
                f"Cassandra refused the credentials (scheduler_cassandra_username/_password): "
                f"{exc}") from exc
        raise StoreUnavailableError(f"Cassandra could not {what}: {exc}") from exc
    except (OperationTimedOut, Unavailable, ReadTimeout, WriteTimeout) as exc:
        raise StoreUnavailableError(f"Cassandra could not {what}: {exc}") from exc
    except InvalidRequest as exc:
        message = str(exc)
        if "does not exist" in message or "unconfigured table" in message.lower():
            raise SchemaMissingError(
                f"the scheduler's Cassandra schema is missing ({message}); create it with "
                "`celery -A <your app> scheduler init`"
            ) from exc
        raise ScheduleStoreError(f"Cassandra rejected a request to {what}: {message}") from exc
    except DriverException as exc:
        raise ScheduleStoreError(f"Cassandra could not {what}: {exc}") from exc
    except ErrorMessage as exc:
        code = getattr(exc, "code", None)
        if code == SERVER_ERROR or code in UNAVAILABLE_CODES:
            raise StoreUnavailableError(f"Cassandra could not {what}: {exc}") from exc
        raise ScheduleStoreError(f"Cassandra rejected a request to {what}: {exc}") from exc


DELETE_ROW = ("DELETE FROM {ks}.schedule WHERE partition = ? AND bucket = ? AND at = ?"
               " AND ordering_id = ? AND unique_key = ?")
# A status row's primary key, in the order StatusLayout.primary_key gives its values.
STATUS_KEY = "shard = ? AND slot = ? AND at = ? AND ordering_id = ? AND unique_key = ?"
_STATUS_KEY_COLUMNS = "shard, slot, at, ordering_id, unique_key"
INSERT_ROW = ("INSERT INTO {ks}.schedule (partition, bucket, at, ordering_id, unique_key, task,"
               " envelope, attempts, not_before, lease_until, blocked)"
               " VALUES (?, ?, ?, ?, ?, ?, ?, ?, null, null, false)")
INDEX_BUCKET = "INSERT INTO {ks}.schedule_buckets (partition, bucket) VALUES (?, ?)"


_STATUS_VALUES = ("state, task, partition, bucket, attempts, last_error, outcome, outcome_attempt,"
                  " updated_at, released_at, started_at, finished_at, outcome_generation")
SELECT_STATUS = f"SELECT {_STATUS_VALUES} FROM {{ks}}.key_status WHERE {STATUS_KEY}"
# The statuses of several keys of one (shard, slot), bound with a list of (at, ordering_id,
# unique_key): one request, however many keys.
SELECT_STATUSES = (f"SELECT at, ordering_id, unique_key, {_STATUS_VALUES} FROM {{ks}}.key_status"
                   " WHERE shard = ? AND slot = ? AND (at, ordering_id, unique_key) IN ?")
_ROW_CLASSES: dict[tuple[str, ...], Any] = {}


def row_factory(column_names: list[str], rows: list[Any]) -> list[Any]:
    """Rows as named tuples, like the driver's default row factory, with one class per column list.

    The default builds a new namedtuple class for every result (hundreds of microseconds of
    CPU), which made each status read of ingest cost more than its request.
    """
    names = tuple(column_names)
    row_class: Any = _ROW_CLASSES.get(names)
    if row_class is None:
        try:
            row_class = collections.namedtuple("Row", names)  # type: ignore[misc,no-redef]
        except ValueError:  # not identifiers (e.g. "[applied]"): the driver cleans them up
            return list(named_tuple_factory(column_names, rows))
        _ROW_CLASSES[names] = row_class
    return [row_class._make(row) for row in rows]


def status_of(key: TaskKey, row: Any) -> TaskStatus | None:
    if row is None or row.state is None:
        return None
    return TaskStatus(key, State(row.state), row.task, row.partition, row.attempts or 0,
                      row.last_error, to_ms(row.updated_at), row.bucket, row.outcome,
                      row.outcome_attempt or 0, to_ms(row.released_at), to_ms(row.started_at),
                      to_ms(row.finished_at), getattr(row, "outcome_generation", None) or 0)


def schedule_envelope(row: Any) -> ScheduleEnvelope | None:
    """The task in *row*'s ``envelope`` column; None if it has none it could run."""
    if row is None or row.envelope is None:
        return None
    try:
        envelope = decode(row.envelope)
    except EnvelopeDecodeError:
        return None
    return envelope if isinstance(envelope, ScheduleEnvelope) else None


def consistency_level(name: str) -> int:
    level = ConsistencyLevel.name_to_value.get(name.upper())
    if level is None:
        raise ConfigurationError(
            f"unknown Cassandra consistency level {name!r}; use one of "
            + ", ".join(sorted(ConsistencyLevel.name_to_value))
        )
    return int(level)


# What each field of a transition (store.lifecycle) is called in the tables: a schedule
# row's dispatch fields, and a status's.
_ROW_COLUMNS = {"attempts": "attempts", "not_before_ms": "not_before", "lease_until_ms": "lease_until",
                "blocked": "blocked"}
_STATUS_COLUMNS = {"state": "state", "task": "task", "partition": "partition", "bucket": "bucket",
                   "attempts": "attempts", "last_error": "last_error", "outcome": "outcome",
                   "outcome_attempt": "outcome_attempt", "outcome_generation": "outcome_generation",
                   "updated_ms": "updated_at", "released_ms": "released_at",
                   "started_ms": "started_at", "finished_ms": "finished_at", "envelope": "envelope"}
_NONE_IF_ZERO = frozenset({"not_before_ms", "lease_until_ms", "released_ms", "started_ms", "finished_ms"})
_ROW_KEY = "partition = ? AND bucket = ? AND at = ? AND ordering_id = ? AND unique_key = ?"


def _column_value(name: str, value: Any) -> Any:
    """A transition's field value as its column takes it: 0 times are null, states their names."""
    if name in _NONE_IF_ZERO:
        return value or None
    if name == "state":
        return value.value
    if name == "envelope":
        return None if value is None else encode(value)
    return value


@functools.cache
def _converted(names: tuple[str, ...]) -> tuple[int, ...]:
    """Which of *names* hold a value its column takes otherwise (see _column_value)."""
    return tuple(i for i, name in enumerate(names)
                 if name in _NONE_IF_ZERO or name in ("state", "envelope"))


def _columns(names: tuple[str, ...], values: tuple[Any, ...]) -> tuple[Any, ...]:
    """*values* (of the fields *names*) as the columns take them (on the hot path: a release
    and a success go through here, so only the values that differ are converted)."""
    converted = _converted(names)
    if not converted:
        return values
    columns = list(values)
    for i in converted:
        columns[i] = _column_value(names[i], columns[i])
    return tuple(columns)


@functools.cache
def row_update(fields: tuple[str, ...]) -> str:
    """The CQL that sets *fields* (StoredTask names) of a schedule row."""
    sets = ", ".join(f"{_ROW_COLUMNS[name]} = ?" for name in fields)
    return f"UPDATE {{ks}}.schedule SET {sets} WHERE {_ROW_KEY}"


@functools.cache
def status_write(fields: tuple[str, ...], expiry: Expiry) -> str:
    """The CQL that writes *fields* (TaskStatus names, and ``envelope``) of a status, lasting as
    *expiry* says: an update, or the status written again whole with a TTL (0: for good) so
    that all of it expires together."""
    columns = [_STATUS_COLUMNS[name] for name in fields]
    if expiry is Expiry.KEEP:
        return f"UPDATE {{ks}}.key_status SET {', '.join(f'{c} = ?' for c in columns)} WHERE {STATUS_KEY}"
    if expiry is Expiry.REPORT:
        return (f"UPDATE {{ks}}.key_status USING TTL ? SET {', '.join(f'{c} = ?' for c in columns)}"
                f" WHERE {STATUS_KEY}")
    marks = ", ".join("?" for _ in range(5 + len(columns)))
    return (f"INSERT INTO {{ks}}.key_status ({_STATUS_KEY_COLUMNS}, {', '.join(columns)})"
            f" VALUES ({marks}) USING TTL ?")


def transition_statements(layout: StatusLayout, transition: Transition, ttl: int) -> Statements:
    """The writes of *transition* (see store.lifecycle): its row's, then its status's.

    *ttl*: seconds a final status is kept.
    """
    key, row, names, expiry = (transition.key, transition.row, transition.status_names,
                               transition.expiry)
    statements: Statements = []
    if row is not None:
        row_pk = (row.partition, row.bucket, key.scheduled_ms, key.ordering_id, key.uniqueness_key)
        kind = row.kind
        if kind is RowKind.UPDATE:
            statements.append((row_update(row.names), (*_columns(row.names, row.values), *row_pk)))
        elif kind is RowKind.DELETE:
            statements.append((DELETE_ROW, row_pk))
        else:
            task = row.task
            assert task is not None
            if row.moved_from is not None:
                statements.append((DELETE_ROW, (*row.moved_from, *row_pk[2:])))
            envelope = row.data if row.data is not None else encode(task.envelope)
            statements.append((INSERT_ROW, (*row_pk, task.envelope.task, envelope, task.attempts)))
    if names:
        values = _columns(names, transition.status_values)
        cql = status_write(names, expiry)
        if expiry is Expiry.KEEP:
            statements.append((cql, (*values, *layout.primary_key(key))))
        elif expiry is Expiry.REPORT:
            statements.append((cql, (ttl, *values, *layout.primary_key(key))))
        else:
            statements.append((cql, (*layout.primary_key(key), *values,
                                     ttl if expiry is Expiry.FINAL else 0)))
    return statements


# A scheduled task's first status: what a schedule record writes (bound with the values of
# lifecycle.scheduled, then a TTL of 0), for code that writes it without the store.
PENDING_STATUS = status_write(("state", "task", "partition", "bucket", "attempts", "last_error",
                               "outcome", "outcome_attempt", "updated_ms"), Expiry.NEVER)
# A finished task's status, written whole with its times so that all of it expires together.
FINAL_STATUS = status_write(("state", "task", "partition", "bucket", "attempts", "last_error",
                             "updated_ms", "released_ms", "started_ms", "finished_ms"), Expiry.FINAL)
