"""The Cassandra side's vocabulary: the CQL statements, how rows map to the store's records,
times, and the translation of cassandra-driver's exceptions into the package's errors.

Every statement the store runs more than once is here, so the CQL is in one place (the
schema is in :mod:`celery_scheduler.store.schema`); ``{ks}`` stands for the keyspace.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
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

from celery_scheduler.envelope import ScheduleEnvelope, decode, encode
from celery_scheduler.errors import (
    ConfigurationError,
    EnvelopeDecodeError,
    ScheduleStoreError,
    SchemaMissingError,
    StoreUnavailableError,
)
from celery_scheduler.keys import TaskKey
from celery_scheduler.store.base import RunTimes, State, StoredTask, TaskStatus
from celery_scheduler.store.status_layout import StatusLayout

__all__ = ["DELETE_ROW", "FAILED_STATUS", "FINAL_STATUS", "INDEX_BUCKET", "INSERT_ROW",
           "PENDING_STATUS", "RETRIED_STATUS", "SELECT_STATUS", "SELECT_STATUSES", "STATUS_KEY",
           "Statements", "consistency_level", "finished_statements", "outcome_statement",
           "released_statements", "retry_later_statements", "row_factory", "row_key",
           "schedule_envelope", "status_of", "times_of", "to_ms", "to_timestamp",
           "translate_errors"]

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
# A scheduled task's first status.
PENDING_STATUS = (f"INSERT INTO {{ks}}.key_status ({_STATUS_KEY_COLUMNS}, state, task, partition,"
                  " bucket, attempts, last_error, outcome, outcome_attempt, updated_at)"
                  " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0, null, null, 0, ?)")
# A finished task's whole status row is written again so that all of it expires together,
# with its times (RunTimes).
FINAL_STATUS = (f"INSERT INTO {{ks}}.key_status ({_STATUS_KEY_COLUMNS}, state, task, partition,"
                " bucket, attempts, last_error, updated_at, released_at, started_at, finished_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?")


# A task that failed for good and left the schedule keeps its envelope, for a retry.
FAILED_STATUS = (f"INSERT INTO {{ks}}.key_status ({_STATUS_KEY_COLUMNS}, state, task, partition,"
                 " bucket, attempts, last_error, updated_at, released_at, started_at, finished_at,"
                 " envelope) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?")
# A retried task: pending again, for good (no TTL), its envelope back in the schedule row.
RETRIED_STATUS = (f"INSERT INTO {{ks}}.key_status ({_STATUS_KEY_COLUMNS}, state, task, partition,"
                  " bucket, attempts, last_error, outcome, outcome_attempt, updated_at, envelope)"
                  " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, null) USING TTL 0")
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


def times_of(run: RunTimes | None) -> tuple[int | None, ...]:
    """*run*'s times as the status columns take them (null: unknown)."""
    return tuple(ms or None for ms in (run or RunTimes()))


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


def row_key(task: StoredTask) -> tuple[Any, ...]:
    """The primary key of *task*'s ``schedule`` row."""
    key = task.key
    return (task.partition, task.bucket, key.scheduled_ms, key.ordering_id,
            key.uniqueness_key)


def released_statements(layout: StatusLayout, task: StoredTask, attempt: int, lease_until_ms: int,
                        now_ms: int) -> Statements:
    return [
        ("UPDATE {ks}.schedule SET attempts = ?, lease_until = ? WHERE partition = ? AND bucket = ?"
         " AND at = ? AND ordering_id = ? AND unique_key = ?",
         (attempt, lease_until_ms, *row_key(task))),
        (f"UPDATE {{ks}}.key_status SET state = ?, attempts = ?, updated_at = ? WHERE {STATUS_KEY}",
         (State.RELEASED.value, attempt, now_ms, *layout.primary_key(task.key))),
    ]


def retry_later_statements(layout: StatusLayout, task: StoredTask, attempts: int,
                           not_before_ms: int, error: str | None, now_ms: int) -> Statements:
    return [
        ("UPDATE {ks}.schedule SET attempts = ?, not_before = ?, lease_until = null"
         " WHERE partition = ? AND bucket = ? AND at = ? AND ordering_id = ? AND unique_key = ?",
         (attempts, not_before_ms, *row_key(task))),
        (f"UPDATE {{ks}}.key_status SET state = ?, attempts = ?, last_error = ?, updated_at = ?"
         f" WHERE {STATUS_KEY}",
         (State.PENDING.value, attempts, error, now_ms, *layout.primary_key(task.key))),
    ]


def finished_statements(layout: StatusLayout, task: StoredTask, state: State, error: str | None,
                        current: TaskStatus | None, now_ms: int, keep_row: bool,
                        run: RunTimes | None, ttl: int) -> Statements:
    """*task* finished: its row goes (or stays, blocked) and its status is written whole."""
    row: tuple[str, tuple[Any, ...]] = (
        ("UPDATE {ks}.schedule SET blocked = true, lease_until = null WHERE partition = ?"
         " AND bucket = ? AND at = ? AND ordering_id = ? AND unique_key = ?", row_key(task))
        if keep_row else (DELETE_ROW, row_key(task)))
    last_error = error if error is not None else (current.last_error if current else None)
    values = (*layout.primary_key(task.key), state.value, task.envelope.task, task.partition, task.bucket,
              task.attempts, last_error, now_ms, *times_of(run))
    if state is State.FAILED and not keep_row:  # kept for a retry, as long as the status
        return [row, (FAILED_STATUS, (*values, encode(task.envelope), ttl))]
    return [row, (FINAL_STATUS, (*values, ttl if not keep_row else 0))]


def outcome_statement(layout: StatusLayout, key: TaskKey, attempt: int, succeeded: bool,
                      error: str | None, now_ms: int, run: RunTimes | None, ttl: int,
                      generation: int = 0) -> tuple[str, tuple[Any, ...]]:
    """A worker's report, recorded for the dispatcher that loads the key later."""
    _, started, finished = times_of(run)
    if succeeded:
        return (f"UPDATE {{ks}}.key_status USING TTL ? SET state = ?, outcome = ?,"
                " outcome_attempt = ?, outcome_generation = ?, updated_at = ?, started_at = ?,"
                f" finished_at = ? WHERE {STATUS_KEY}",
                (ttl, State.SUCCEEDED.value, "succeeded", attempt, generation, now_ms,
                 started, finished, *layout.primary_key(key)))
    return (f"UPDATE {{ks}}.key_status USING TTL ? SET outcome = ?, outcome_attempt = ?,"
            " outcome_generation = ?, last_error = ?, updated_at = ?, started_at = ?,"
            f" finished_at = ? WHERE {STATUS_KEY}",
            (ttl, "failed", attempt, generation, error, now_ms, started, finished,
             *layout.primary_key(key)))
