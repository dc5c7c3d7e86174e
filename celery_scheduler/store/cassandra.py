"""The schedule store on Apache Cassandra, through cassandra-driver.

Writes use ``scheduler_cassandra_consistency`` (LOCAL_QUORUM by default), so an
acknowledged write survives the loss of a replica. cassandra-driver exceptions are
translated into :mod:`celery_scheduler.errors`.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import logging
import ssl
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
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
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import (
    EXEC_PROFILE_DEFAULT,
    Cluster,
    ExecutionProfile,
    NoHostAvailable,
    ResponseFuture,
    Session,
)
from cassandra.concurrent import execute_concurrent_with_args
from cassandra.policies import (
    DCAwareRoundRobinPolicy,
    ExponentialReconnectionPolicy,
    TokenAwarePolicy,
)
from cassandra.query import BatchStatement, BatchType, named_tuple_factory

from celery_scheduler.envelope import ScheduleEnvelope, decode, encode
from celery_scheduler.errors import (
    ConfigurationError,
    EnvelopeDecodeError,
    ScheduleStoreError,
    SchemaMissingError,
    StoreUnavailableError,
)
from celery_scheduler.keys import TaskKey
from celery_scheduler.store.base import (
    Cursor,
    Lease,
    Operation,
    Put,
    Retry,
    RunTimes,
    ScheduleStore,
    State,
    StoredTask,
    TaskStatus,
    settled_state,
    write_bucket,
)
from celery_scheduler.store.fencing import FencedTimestamps
from celery_scheduler.store.schema import ADDED_COLUMNS, check_identifier, keyspace_statements

__all__ = ["CassandraScheduleStore", "translate_errors"]

logger = logging.getLogger(__name__)

_EPOCH = dt.datetime(1970, 1, 1)


def _ms(value: dt.datetime | None) -> int:
    if value is None:
        return 0
    delta = value.replace(tzinfo=None) - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def _ts(ms: int) -> dt.datetime:
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


_DELETE_ROW = ("DELETE FROM {ks}.schedule WHERE partition = ? AND bucket = ? AND at = ?"
               " AND ordering_id = ? AND unique_key = ?")
# A finished task's whole status row is written again so that all of it expires together,
# with its times (RunTimes).
_FINAL_STATUS = ("INSERT INTO {ks}.task_status (ordering_id, at, unique_key, state, task, partition,"
                 " bucket, attempts, last_error, updated_at, released_at, started_at, finished_at)"
                 " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?")


# A task that failed for good and left the schedule keeps its envelope, for a retry.
_FAILED_STATUS = ("INSERT INTO {ks}.task_status (ordering_id, at, unique_key, state, task, partition,"
                  " bucket, attempts, last_error, updated_at, released_at, started_at, finished_at,"
                  " envelope) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?")
# A retried task: pending again, for good (no TTL), its envelope back in the schedule row.
_RETRIED_STATUS = ("INSERT INTO {ks}.task_status (ordering_id, at, unique_key, state, task, partition,"
                   " bucket, attempts, last_error, outcome, outcome_attempt, updated_at, envelope)"
                   " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, null) USING TTL 0")
_INSERT_ROW = ("INSERT INTO {ks}.schedule (partition, bucket, at, ordering_id, unique_key, task,"
               " envelope, attempts, not_before, lease_until, blocked)"
               " VALUES (?, ?, ?, ?, ?, ?, ?, ?, null, null, false)")
_INDEX_BUCKET = "INSERT INTO {ks}.schedule_buckets (partition, bucket) VALUES (?, ?)"


_SELECT_STATUS = ("SELECT state, task, partition, bucket, attempts, last_error, outcome, outcome_attempt,"
                  " updated_at, released_at, started_at, finished_at FROM {ks}.task_status"
                  " WHERE ordering_id = ? AND at = ? AND unique_key = ?")
# Requests in flight at once for bulk reads and writes.
CONCURRENCY = 64
_Statements = list[tuple[str, tuple[Any, ...]]]
# Seconds between attempts to reach a node marked down: the driver's default grows to
# 10 minutes, so after a Cassandra restart a dispatcher stayed idle for about as long
# again as the outage lasted; a few seconds cost nothing while it is down.
RECONNECT_DELAYS = (0.5, 5.0)
# Statement sets carrying more blob bytes than this are not sent as one batch (see _grouped).
BATCH_LIMIT_BYTES = 32 * 1024
# Several small statement sets share one batch up to these limits (see _batches).
PACK_STATEMENTS = 10
PACK_BYTES = 4096


_ROW_CLASSES: dict[tuple[str, ...], Any] = {}


def _rows(column_names: list[str], rows: list[Any]) -> list[Any]:
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


# Lightweight transactions use the driver's own row factory: ``was_applied`` accepts only that.
_LWT_PROFILE = "celery_scheduler_lwt"


def _status(key: TaskKey, row: Any) -> TaskStatus | None:
    if row is None or row.state is None:
        return None
    return TaskStatus(key, State(row.state), row.task, row.partition, row.attempts or 0,
                      row.last_error, _ms(row.updated_at), row.bucket, row.outcome,
                      row.outcome_attempt or 0, _ms(row.released_at), _ms(row.started_at),
                      _ms(row.finished_at))


def _times(run: RunTimes | None) -> tuple[dt.datetime | None, ...]:
    """*run*'s times as the status columns take them (null: unknown)."""
    return tuple(_ts(ms) if ms else None for ms in (run or RunTimes()))


def _schedule_envelope(row: Any) -> ScheduleEnvelope | None:
    """The task in *row*'s ``envelope`` column; None if it has none it could run."""
    if row is None or row.envelope is None:
        return None
    try:
        envelope = decode(row.envelope)
    except EnvelopeDecodeError:
        return None
    return envelope if isinstance(envelope, ScheduleEnvelope) else None


def _consistency(name: str) -> int:
    level = ConsistencyLevel.name_to_value.get(name.upper())
    if level is None:
        raise ConfigurationError(
            f"unknown Cassandra consistency level {name!r}; use one of "
            + ", ".join(sorted(ConsistencyLevel.name_to_value))
        )
    return int(level)


class CassandraScheduleStore(ScheduleStore):
    """Pending tasks and task status in one Cassandra keyspace."""

    def __init__(self, contact_points: Sequence[str], keyspace: str, *, port: int = 9042,
                 replication: dict[str, Any] | None = None, consistency: str = "LOCAL_QUORUM",
                 serial_consistency: str = "LOCAL_SERIAL",
                 bucket_seconds: int = 60, status_ttl: int = 7 * 24 * 3600,
                 username: str | None = None, password: str | None = None,
                 use_ssl: bool = False, request_timeout: float = 10.0) -> None:
        self.keyspace = check_identifier(keyspace, "keyspace")
        self.replication = replication or {"class": "SimpleStrategy", "replication_factor": 1}
        self.bucket_seconds = bucket_seconds
        self.status_ttl = status_ttl
        self._consistency = _consistency(consistency)
        self._serial = _consistency(serial_consistency)
        auth = PlainTextAuthProvider(username, password) if username else None
        ssl_context = ssl.create_default_context() if use_ssl else None
        profile = ExecutionProfile(load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy()),
                                   consistency_level=self._consistency,
                                   serial_consistency_level=self._serial,
                                   request_timeout=request_timeout, row_factory=_rows)
        lwt_profile = ExecutionProfile(load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy()),
                                       consistency_level=self._consistency,
                                       serial_consistency_level=self._serial,
                                       request_timeout=request_timeout)
        self._timestamps = FencedTimestamps()
        self._cluster = Cluster(list(contact_points), port=port, auth_provider=auth,
                                ssl_context=ssl_context, connect_timeout=request_timeout,
                                timestamp_generator=self._timestamps,
                                execution_profiles={EXEC_PROFILE_DEFAULT: profile, _LWT_PROFILE: lwt_profile},
                                reconnection_policy=ExponentialReconnectionPolicy(*RECONNECT_DELAYS))
        with translate_errors("connect"):
            self._session: Session = self._cluster.connect()
        self._prepared: dict[str, Any] = {}
        # buckets this process indexed already: one index write per bucket, not per task
        self._indexed: set[tuple[int, int]] = set()

    def fence_writes(self, fence: Callable[[int], float | None]) -> None:
        self._timestamps.fence = fence

    def _prepare(self, cql: str) -> Any:
        statement = self._prepared.get(cql)
        if statement is None:
            with translate_errors("prepare a statement"):
                statement = self._session.prepare(cql.format(ks=self.keyspace))
            statement.consistency_level = self._consistency
            self._prepared[cql] = statement
        return statement

    def create_schema(self) -> None:
        with translate_errors("create the schema"):
            for statement in keyspace_statements(self.keyspace, self.replication):
                self._session.execute(statement, timeout=60)
            self._cluster.control_connection.wait_for_schema_agreement()
            for table, column, cql_type in self._missing_columns():
                self._session.execute(f"ALTER TABLE {self.keyspace}.{table} ADD {column} {cql_type}",
                                      timeout=60)
            self._cluster.control_connection.wait_for_schema_agreement()

    def _missing_columns(self) -> list[tuple[str, str, str]]:
        self._cluster.refresh_schema_metadata()
        keyspace = self._cluster.metadata.keyspaces.get(self.keyspace)
        tables = keyspace.tables if keyspace is not None else {}
        return [(table, column, cql_type) for table, column, cql_type in ADDED_COLUMNS
                if table in tables and column not in tables[table].columns]

    def check_schema(self) -> None:
        """Raise SchemaMissingError if the keyspace lacks a column this version writes."""
        with translate_errors("read the schema"):
            missing = self._missing_columns()
        if missing:
            raise SchemaMissingError(
                f"the scheduler's Cassandra schema lacks column(s) "
                f"{', '.join(f'{table}.{column}' for table, column, _ in missing)}, added in this "
                "version; add them with `celery -A <your app> scheduler init` (idempotent)")

    def _execute(self, what: str, cql: str, params: tuple[Any, ...],
                 partition: int | None = None) -> Any:
        """Run one statement; a write names the *partition* it belongs to (for its fence)."""
        with translate_errors(what), self._timestamps.writing(partition):
            return self._session.execute(self._prepare(cql), params)

    def _batch_statement(self, statements: _Statements) -> BatchStatement:
        # Unlogged: every caller retries the whole set until it is acknowledged (ingest does
        # not commit, the engine re-reads), and all writes are idempotent, so the batch log's
        # extra round of writes would buy nothing.
        batch = BatchStatement(batch_type=BatchType.UNLOGGED, consistency_level=self._consistency)
        for cql, params in statements:
            batch.add(self._prepare(cql), params)
        return batch

    def _grouped(self, statements: _Statements) -> list[Any]:
        """One batch, or, for a set carrying a large envelope, its statements one by one.

        Cassandra refuses batches over its ``batch_size_fail_threshold`` (50 KiB by default)
        whatever the client retries, so a task that large would hold its partition forever.
        Sent separately the writes are just as idempotent, and an unlogged batch of several
        partitions was never atomic anyway.
        """
        size = sum(len(value) for _, params in statements for value in params
                   if isinstance(value, bytes))
        if size < BATCH_LIMIT_BYTES:
            return [self._batch_statement(statements)]
        return [self._prepare(cql).bind(params) for cql, params in statements]

    def _batch(self, what: str, partition: int, statements: _Statements) -> None:
        self._batches(what, [(partition, statements)])

    def _batches(self, what: str, statement_sets: Sequence[tuple[int, _Statements]]) -> None:
        """Write each (partition, statements) set, all of them concurrently.

        A set shares a request only with sets of the same partition: a request carries one
        timestamp, and each partition's writes are fenced on their own (see
        :mod:`celery_scheduler.store.fencing`).
        """
        by_partition: dict[int, list[_Statements]] = {}
        for partition, statements in statement_sets:
            if statements:
                by_partition.setdefault(partition, []).append(statements)
        self._send(what, [(partition, request) for partition, sets in by_partition.items()
                          for request in self._packed(sets)])

    def _packed(self, statement_sets: list[_Statements]) -> list[Any]:
        """The sets as few requests: small sets share unlogged batches.

        Each set goes whole into one batch, up to PACK_STATEMENTS statements (so at most
        that many Cassandra partitions, within the server's warning threshold of 10) and
        PACK_BYTES of values (it warns above 5 KiB). Each request has a fixed cost in the
        Python driver and in the server, so fewer, fuller requests write the same rows faster.
        """
        requests: list[Any] = []
        pending: _Statements = []
        size = 0
        for statements in statement_sets:
            weight = sum(len(value) for _, params in statements for value in params
                         if isinstance(value, (bytes, str)))
            if weight >= PACK_BYTES:
                requests += self._grouped(statements)
                continue
            if pending and (len(pending) + len(statements) > PACK_STATEMENTS
                            or size + weight > PACK_BYTES):
                requests.append(self._batch_statement(pending))
                pending, size = [], 0
            pending += statements
            size += weight
        if pending:
            requests.append(self._batch_statement(pending))
        return requests

    def _send(self, what: str, requests: list[tuple[int, Any]]) -> None:
        """Send the requests with up to CONCURRENCY in flight: one round trip's latency for all.

        Every request is sent from this thread, in the block that names its partition: the
        driver takes a request's timestamp on the thread that sends it.
        """
        in_flight: collections.deque[ResponseFuture] = collections.deque()
        with translate_errors(what):
            for partition, request in requests:
                if len(in_flight) >= CONCURRENCY:
                    in_flight.popleft().result()
                with self._timestamps.writing(partition):
                    in_flight.append(self._session.execute_async(request))
            while in_flight:
                in_flight.popleft().result()

    @staticmethod
    def _pk(key: TaskKey) -> tuple[str, dt.datetime, str]:
        return (key.ordering_id, _ts(key.scheduled_ms), key.uniqueness_key)

    def _plan_put(self, partition: int, envelope: ScheduleEnvelope, current: TaskStatus | None,
                  now_ms: int, data: bytes | None = None
                  ) -> tuple[_Statements, StoredTask | None]:
        key = envelope.key
        if current is not None and current.state.finished:
            logger.info("not scheduling %s again: it already %s", key, current.state.value)
            return [], None
        if current is not None and current.state is State.RELEASED:
            logger.info("not rescheduling %s: it is running", key)
            return [], None
        if current is not None and current.state is State.CANCELLED:
            # A schedule record read again after its cancel (a batch re-read after a failed
            # commit or a rebalance) must not bring the task back: a cancel is final.
            logger.info("not scheduling %s again: it was cancelled", key)
            return [], None
        if current is not None and current.attempts > 0:
            logger.info("not rescheduling %s: it waits for attempt %d", key, current.attempts + 1)
            return [], None
        bucket = write_bucket(key.scheduled_ms, now_ms, self.bucket_seconds)
        statements: _Statements = []
        if current is not None and current.state is State.PENDING and current.bucket is not None:
            if current.partition == partition:
                bucket = current.bucket  # in place: see ScheduleStore.put
            else:
                statements.append((_DELETE_ROW, (current.partition, current.bucket, _ts(key.scheduled_ms),
                                                 key.ordering_id, key.uniqueness_key)))
        statements += [
            (_INSERT_ROW, (partition, bucket, _ts(key.scheduled_ms), key.ordering_id,
                           key.uniqueness_key, envelope.task,
                           data if data is not None else encode(envelope), 0)),
            ("INSERT INTO {ks}.task_status (ordering_id, at, unique_key, state, task, partition, bucket,"
             " attempts, last_error, outcome, outcome_attempt, updated_at)"
             " VALUES (?, ?, ?, ?, ?, ?, ?, 0, null, null, 0, ?)",
             (*self._pk(key), State.PENDING.value, envelope.task, partition, bucket, _ts(now_ms))),
        ]
        if (partition, bucket) not in self._indexed:
            statements.append((_INDEX_BUCKET, (partition, bucket)))
        return statements, StoredTask(partition, bucket, envelope)

    def _plan_retry(self, partition: int, key: TaskKey, current: TaskStatus | None, now_ms: int
                    ) -> tuple[_Statements, StoredTask | None]:
        """Make a failed *key* pending again, with its attempts so far (see ScheduleStore.retry)."""
        if current is None or current.state is not State.FAILED:
            return [], None
        blocked = self.task(key)  # a failed task's row is kept only while it blocks its ordering id
        if blocked is not None:
            stored = replace(blocked, not_before_ms=0, lease_until_ms=0, blocked=False)
            statements: _Statements = [(
                "UPDATE {ks}.schedule SET blocked = false, not_before = null, lease_until = null"
                " WHERE partition = ? AND bucket = ? AND at = ? AND ordering_id = ? AND unique_key = ?",
                self._row_pk(stored))]
        else:
            envelope = self.kept_envelope(key)
            if envelope is None:
                return [], None
            bucket = write_bucket(key.scheduled_ms, now_ms, self.bucket_seconds)
            stored = StoredTask(partition, bucket, envelope, attempts=current.attempts)
            statements = [(_INSERT_ROW, (partition, bucket, _ts(key.scheduled_ms), key.ordering_id,
                                         key.uniqueness_key, envelope.task, encode(envelope),
                                         current.attempts))]
            if (partition, bucket) not in self._indexed:
                statements.append((_INDEX_BUCKET, (partition, bucket)))
        statements.append((_RETRIED_STATUS, (
            *self._pk(key), State.PENDING.value, current.task, stored.partition, stored.bucket,
            current.attempts, current.last_error, current.outcome, current.outcome_attempt,
            _ts(now_ms))))
        return statements, stored

    def kept_envelope(self, key: TaskKey) -> ScheduleEnvelope | None:
        row = self._execute(f"read the kept task of {key}",
                            "SELECT envelope FROM {ks}.task_status WHERE ordering_id = ? AND at = ?"
                            " AND unique_key = ?", self._pk(key)).one()
        return _schedule_envelope(row)

    def _plan_cancel(self, key: TaskKey, current: TaskStatus | None, now_ms: int
                     ) -> _Statements:
        if current is None or current.bucket is None or current.state not in (State.PENDING,
                                                                                State.FAILED):
            return []
        row_pk = (current.partition, current.bucket, _ts(key.scheduled_ms), key.ordering_id,
                  key.uniqueness_key)
        if current.state is State.FAILED:  # only a task blocked after its last attempt
            row = self._execute(f"read task {key}", "SELECT blocked FROM {ks}.schedule WHERE partition = ?"
                                " AND bucket = ? AND at = ? AND ordering_id = ? AND unique_key = ?",
                                row_pk).one()
            if row is None:
                return []
        return [
            (_DELETE_ROW, row_pk),
            (_FINAL_STATUS, (*self._pk(key), State.CANCELLED.value, current.task, current.partition,
                             current.bucket, current.attempts, current.last_error, _ts(now_ms),
                             *_times(None), self.status_ttl)),
        ]

    def _indexed_now(self, planned: list[StoredTask | None]) -> None:
        if len(self._indexed) > 100_000:
            self._indexed.clear()
        self._indexed.update((t.partition, t.bucket) for t in planned if t is not None)

    def put(self, partition: int, envelope: ScheduleEnvelope, now_ms: int) -> StoredTask | None:
        statements, stored = self._plan_put(partition, envelope, self.status(envelope.key), now_ms)
        if statements:
            self._batch(f"store task {envelope.key}", partition, statements)
            self._indexed_now([stored])
        return stored

    def cancel(self, partition: int, key: TaskKey, now_ms: int) -> bool:
        statements = self._plan_cancel(key, self.status(key), now_ms)
        if statements:
            self._batch(f"cancel task {key}", partition, statements)
        return bool(statements)

    def retry(self, partition: int, key: TaskKey, now_ms: int) -> StoredTask | None:
        statements, stored = self._plan_retry(partition, key, self.status(key), now_ms)
        if statements:
            self._batch(f"retry task {key}", partition, statements)
            self._indexed_now([stored])
        return stored

    def apply(self, operations: list[Operation], now_ms: int) -> list[StoredTask | bool | None]:
        """Read every key's status concurrently, then write every batch concurrently."""
        if len({op.key for op in operations}) != len(operations):
            raise ValueError("apply() takes at most one operation per task key")
        statuses = self.statuses([op.key for op in operations])
        results: list[StoredTask | bool | None] = []
        statement_sets: list[tuple[int, _Statements]] = []
        for op, current in zip(operations, statuses, strict=True):
            if isinstance(op, Put):
                statements, stored = self._plan_put(op.partition, op.envelope, current, now_ms, op.data)
                results.append(stored)
            elif isinstance(op, Retry):
                statements, stored = self._plan_retry(op.partition, op.key, current, now_ms)
                results.append(stored)
            else:
                statements = self._plan_cancel(op.key, current, now_ms)
                results.append(bool(statements))
            statement_sets.append((op.partition, statements))
        self._batches(f"store {len(operations)} task(s)", statement_sets)
        self._indexed_now([r for r in results if isinstance(r, StoredTask)])
        return results

    def statuses(self, keys: Sequence[TaskKey]) -> list[TaskStatus | None]:
        if not keys:
            return []
        statement = self._prepare(_SELECT_STATUS)
        with translate_errors(f"read the status of {len(keys)} task(s)"):
            answers = execute_concurrent_with_args(self._session, statement,
                                                   [self._pk(k) for k in keys],
                                                   concurrency=CONCURRENCY, raise_on_first_error=True)
        return [_status(key, result.one()) for key, (_, result) in zip(keys, answers, strict=True)]

    def status(self, key: TaskKey) -> TaskStatus | None:
        return _status(key, self._execute(f"read the status of {key}", _SELECT_STATUS,
                                          self._pk(key)).one())

    def task(self, key: TaskKey) -> StoredTask | None:
        current = self.status(key)
        if current is None or current.bucket is None:
            return None
        row = self._execute(f"read the row of {key}",
                            "SELECT envelope, attempts, not_before, lease_until, blocked"
                            " FROM {ks}.schedule WHERE partition = ? AND bucket = ? AND at = ?"
                            " AND ordering_id = ? AND unique_key = ?",
                            (current.partition, current.bucket, _ts(key.scheduled_ms),
                             key.ordering_id, key.uniqueness_key)).one()
        envelope = _schedule_envelope(row)
        if envelope is None:
            return None
        return StoredTask(current.partition, current.bucket, envelope, row.attempts or 0,
                          _ms(row.not_before), _ms(row.lease_until), bool(row.blocked))

    def leases(self) -> list[Lease]:
        rows = self._execute("read the partition leases",
                             "SELECT partition, owner, epoch, expires_at FROM {ks}.partition_lease", ())
        return sorted((Lease(row.partition, row.owner or "", row.epoch or 0, _ms(row.expires_at))
                       for row in rows), key=lambda lease: lease.partition)

    def backlog(self, partition: int) -> tuple[int, int | None]:
        # an operator's query: one count per indexed bucket of the partition
        count, earliest = 0, None
        for bucket in self.buckets(partition, 0, 2**62, limit=1_000_000):
            row = self._execute(f"count bucket {bucket} of partition {partition}",
                                "SELECT count(*) AS n, min(at) AS first FROM {ks}.schedule"
                                " WHERE partition = ? AND bucket = ?", (partition, bucket)).one()
            if row is not None and row.n:
                count += row.n
                if row.first is not None:  # an overdue row sits in a later bucket than its time
                    first = _ms(row.first)
                    earliest = first if earliest is None else min(earliest, first)
        return count, earliest

    def statuses_in_state(self, state: State, limit: int) -> list[TaskStatus]:
        # an operator's query: state is no key of the table, so Cassandra scans it (paged)
        # until it found *limit*
        rows = self._execute(
            f"find {state.value} tasks",
            "SELECT ordering_id, at, unique_key, state, task, partition, bucket, attempts,"
            " last_error, outcome, outcome_attempt, updated_at FROM {ks}.task_status"
            " WHERE state = ? LIMIT ? ALLOW FILTERING", (state.value, limit))
        found = []
        for row in rows:
            status = _status(TaskKey(row.ordering_id, _ms(row.at), row.unique_key), row)
            if status is not None:
                found.append(status)
        return found

    def bucket_sizes(self, partition: int, first: int, last: int) -> dict[int, int]:
        # an operator's query: one count per indexed bucket in the range
        sizes = {}
        for bucket in self.buckets(partition, first, last, limit=1_000_000):
            row = self._execute(f"count bucket {bucket} of partition {partition}",
                                "SELECT count(*) AS n FROM {ks}.schedule"
                                " WHERE partition = ? AND bucket = ?", (partition, bucket)).one()
            if row is not None and row.n:
                sizes[bucket] = int(row.n)
        return sizes

    def rows_of(self, partition: int, ordering_id: str, limit: int = 1000) -> list[StoredTask]:
        # an operator's query: each indexed bucket of the partition, filtered in Cassandra
        found: list[StoredTask] = []
        for bucket in self.buckets(partition, 0, 2**62, limit=1_000_000):
            rows = self._execute(
                f"read the rows of {ordering_id!r} in bucket {bucket} of partition {partition}",
                "SELECT at, unique_key, envelope, attempts, not_before, lease_until, blocked"
                " FROM {ks}.schedule WHERE partition = ? AND bucket = ? AND ordering_id = ?"
                " ALLOW FILTERING", (partition, bucket, ordering_id))
            for row in rows:
                try:
                    envelope = decode(row.envelope) if row.envelope is not None else None
                except EnvelopeDecodeError:
                    continue
                if isinstance(envelope, ScheduleEnvelope):
                    found.append(StoredTask(partition, bucket, envelope, row.attempts or 0,
                                            _ms(row.not_before), _ms(row.lease_until),
                                            bool(row.blocked)))
            if len(found) >= limit:
                break
        return sorted(found, key=lambda row: row.position)[:limit]

    def buckets(self, partition: int, first: int, last: int, limit: int = 100) -> list[int]:
        rows = self._execute(
            f"list buckets of partition {partition}",
            "SELECT bucket FROM {ks}.schedule_buckets WHERE partition = ? AND bucket >= ?"
            " AND bucket <= ? LIMIT ?", (partition, first, last, limit))
        return [row.bucket for row in rows]

    def read(self, partition: int, after: Cursor, limit: int, inclusive: bool = False
             ) -> list[StoredTask]:
        found: list[StoredTask] = []
        position, operator = after, ">=" if inclusive else ">"
        while True:
            asked = limit - len(found)
            rows = list(self._execute(
                f"read bucket {after.bucket} of partition {partition}",
                "SELECT at, ordering_id, unique_key, envelope, attempts, not_before, lease_until, blocked"
                " FROM {ks}.schedule WHERE partition = ? AND bucket = ?"
                f" AND (at, ordering_id, unique_key) {operator} (?, ?, ?) LIMIT ?",
                (partition, after.bucket, _ts(position.at_ms), position.ordering_id,
                 position.uniqueness_key, asked)))
            remnants: list[tuple[Any, str | None]] = []
            for row in rows:
                try:
                    envelope = decode(row.envelope) if row.envelope is not None else None
                except EnvelopeDecodeError as exc:
                    remnants.append((row, f"its stored task could not be decoded: {exc}"))
                    continue
                if not isinstance(envelope, ScheduleEnvelope):
                    remnants.append((row, None))
                    continue
                found.append(StoredTask(partition, after.bucket, envelope, row.attempts or 0,
                                        _ms(row.not_before), _ms(row.lease_until), bool(row.blocked)))
            if remnants:
                self._settle_remnants(partition, after.bucket, remnants)
            # A short page is the bucket's end only if every row in it was a task: the loader
            # takes fewer rows than it asked for as "nothing more here".
            if not remnants or len(rows) < asked:
                return found
            last = rows[-1]
            position = Cursor(after.bucket, _ms(last.at), last.ordering_id, last.unique_key)
            operator = ">"

    def _settle_remnants(self, partition: int, bucket: int, remnants: list[tuple[Any, str | None]]
                         ) -> None:
        """Remove rows without a readable task, and give their keys a final status.

        A row without its task is what a dispatch update leaves when it lands just after a
        cancel or a completion (see :func:`settled_state`); a task that cannot be decoded
        (written by an incompatible version) cannot run either, and is recorded as failed.
        """
        keys = [TaskKey(row.ordering_id, _ms(row.at), row.unique_key) for row, _ in remnants]
        now_ms = int(time.time() * 1000)
        statement_sets: list[tuple[int, _Statements]] = []
        for (row, error), key, status in zip(remnants, keys, self.statuses(keys), strict=True):
            state = settled_state(status, partition, bucket)
            if error is not None and state is not None:
                state = State.FAILED
            logger.warning("removing a schedule row without a runnable task: %s (%s); its status: %s",
                           key, error or "its task was removed by a cancel or a completion",
                           status.state.value if status else "unknown")
            statements: _Statements = [
                (_DELETE_ROW, (partition, bucket, row.at, row.ordering_id, row.unique_key))]
            if state is not None and status is not None:
                statements.append((_FINAL_STATUS, (
                    *self._pk(key), state.value, status.task, partition, bucket, status.attempts,
                    error or status.last_error, _ts(now_ms),
                    *_times(RunTimes(status.released_ms, status.started_ms, status.finished_ms)),
                    self.status_ttl)))
            statement_sets.append((partition, statements))
        self._batches(f"remove {len(remnants)} schedule row(s) without a task", statement_sets)

    def drop_bucket(self, partition: int, bucket: int) -> None:
        self._indexed.discard((partition, bucket))
        self._execute(f"drop bucket {bucket} of partition {partition}",
                      "DELETE FROM {ks}.schedule_buckets WHERE partition = ? AND bucket = ?",
                      (partition, bucket), partition)

    def _row_pk(self, task: StoredTask) -> tuple[Any, ...]:
        key = task.key
        return (task.partition, task.bucket, _ts(key.scheduled_ms), key.ordering_id, key.uniqueness_key)

    def _released(self, task: StoredTask, attempt: int, lease_until_ms: int, now_ms: int
                  ) -> _Statements:
        return [
            ("UPDATE {ks}.schedule SET attempts = ?, lease_until = ? WHERE partition = ? AND bucket = ?"
             " AND at = ? AND ordering_id = ? AND unique_key = ?",
             (attempt, _ts(lease_until_ms), *self._row_pk(task))),
            ("UPDATE {ks}.task_status SET state = ?, attempts = ?, updated_at = ?"
             " WHERE ordering_id = ? AND at = ? AND unique_key = ?",
             (State.RELEASED.value, attempt, _ts(now_ms), *self._pk(task.key))),
        ]

    def mark_released(self, task: StoredTask, attempt: int, lease_until_ms: int, now_ms: int) -> None:
        self._batch(f"mark {task.key} released", task.partition,
                    self._released(task, attempt, lease_until_ms, now_ms))

    def mark_released_many(self, releases: Sequence[tuple[StoredTask, int, int]], now_ms: int) -> None:
        self._batches(f"mark {len(releases)} task(s) released",
                      [(task.partition, self._released(task, attempt, lease_until_ms, now_ms))
                       for task, attempt, lease_until_ms in releases])

    def mark_retry(self, task: StoredTask, attempts: int, not_before_ms: int, error: str | None,
                   now_ms: int) -> None:
        self._batch(f"schedule a retry of {task.key}", task.partition, [
            ("UPDATE {ks}.schedule SET attempts = ?, not_before = ?, lease_until = null"
             " WHERE partition = ? AND bucket = ? AND at = ? AND ordering_id = ? AND unique_key = ?",
             (attempts, _ts(not_before_ms), *self._row_pk(task))),
            ("UPDATE {ks}.task_status SET state = ?, attempts = ?, last_error = ?, updated_at = ?"
             " WHERE ordering_id = ? AND at = ? AND unique_key = ?",
             (State.PENDING.value, attempts, error, _ts(now_ms), *self._pk(task.key))),
        ])

    @staticmethod
    def _may_have_error(task: StoredTask) -> bool:
        # Only a failed attempt (or a failed publish) records an error, and each of those
        # leaves a retry time on the row; a first attempt without one has none to keep.
        return task.attempts > 1 or task.not_before_ms > 0

    def _finished(self, task: StoredTask, state: State, error: str | None, current: TaskStatus | None,
                  now_ms: int, keep_row: bool, run: RunTimes | None) -> _Statements:
        row: tuple[str, tuple[Any, ...]] = (
            ("UPDATE {ks}.schedule SET blocked = true, lease_until = null WHERE partition = ?"
             " AND bucket = ? AND at = ? AND ordering_id = ? AND unique_key = ?", self._row_pk(task))
            if keep_row else (_DELETE_ROW, self._row_pk(task)))
        last_error = error if error is not None else (current.last_error if current else None)
        values = (*self._pk(task.key), state.value, task.envelope.task, task.partition, task.bucket,
                  task.attempts, last_error, _ts(now_ms), *_times(run))
        if state is State.FAILED and not keep_row:  # kept for a retry, as long as the status
            return [row, (_FAILED_STATUS, (*values, encode(task.envelope), self.status_ttl))]
        return [row, (_FINAL_STATUS, (*values, self.status_ttl if not keep_row else 0))]

    def finish(self, task: StoredTask, state: State, error: str | None, now_ms: int,
               keep_row: bool = False, run: RunTimes | None = None) -> None:
        # the whole status row is written again (see _FINAL_STATUS): keep its last error
        current = self.status(task.key) if error is None and self._may_have_error(task) else None
        self._batch(f"mark {task.key} {state.value}", task.partition,
                    self._finished(task, state, error, current, now_ms, keep_row, run))

    def finish_many(self, tasks: Sequence[StoredTask], state: State, now_ms: int,
                    runs: Mapping[TaskKey, RunTimes] | None = None) -> None:
        reading = [task.key for task in tasks if self._may_have_error(task)]
        current = dict(zip(reading, self.statuses(reading), strict=True)) if reading else {}
        runs = runs or {}
        self._batches(f"mark {len(tasks)} task(s) {state.value}",
                      [(task.partition,
                        self._finished(task, state, None, current.get(task.key), now_ms, False,
                                       runs.get(task.key)))
                       for task in tasks])

    def _outcome(self, key: TaskKey, attempt: int, succeeded: bool, error: str | None,
                 now_ms: int, run: RunTimes | None) -> tuple[str, tuple[Any, ...]]:
        _, started, finished = _times(run)
        if succeeded:
            return ("UPDATE {ks}.task_status USING TTL ? SET state = ?, outcome = ?,"
                    " outcome_attempt = ?, updated_at = ?, started_at = ?, finished_at = ?"
                    " WHERE ordering_id = ? AND at = ? AND unique_key = ?",
                    (self.status_ttl, State.SUCCEEDED.value, "succeeded", attempt, _ts(now_ms),
                     started, finished, *self._pk(key)))
        return ("UPDATE {ks}.task_status USING TTL ? SET outcome = ?, outcome_attempt = ?,"
                " last_error = ?, updated_at = ?, started_at = ?, finished_at = ?"
                " WHERE ordering_id = ? AND at = ? AND unique_key = ?",
                (self.status_ttl, "failed", attempt, error, _ts(now_ms), started, finished,
                 *self._pk(key)))

    def record_outcome(self, partition: int, key: TaskKey, attempt: int, succeeded: bool,
                       error: str | None, now_ms: int, run: RunTimes | None = None) -> None:
        self._execute(f"record the outcome of {key}",
                      *self._outcome(key, attempt, succeeded, error, now_ms, run), partition)

    def record_outcomes(self, outcomes: Sequence[tuple[int, TaskKey, int, bool, str | None]],
                        now_ms: int, runs: Mapping[TaskKey, RunTimes] | None = None) -> None:
        runs = runs or {}
        self._batches(f"record {len(outcomes)} outcome(s)",
                      [(partition, [self._outcome(key, attempt, succeeded, error, now_ms,
                                                  runs.get(key))])
                       for partition, key, attempt, succeeded, error in outcomes])

    def _lwt(self, what: str, cql: str, params: tuple[Any, ...]) -> Any:
        statement = self._prepare(cql)
        statement.serial_consistency_level = self._serial
        with translate_errors(what):
            return self._session.execute(statement, params, execution_profile=_LWT_PROFILE)

    def acquire_lease(self, partition: int, owner: str, ttl_ms: int, now_ms: int) -> Lease | None:
        current = self._lwt(f"read the lease of partition {partition}",
                            "SELECT owner, epoch, expires_at FROM {ks}.partition_lease WHERE partition = ?",
                            (partition,)).one()
        expires = now_ms + ttl_ms
        if current is None:
            applied = self._lwt(f"take partition {partition}",
                                "INSERT INTO {ks}.partition_lease (partition, owner, epoch, expires_at)"
                                " VALUES (?, ?, 1, ?) IF NOT EXISTS",
                                (partition, owner, _ts(expires))).was_applied
            return Lease(partition, owner, 1, expires) if applied else None
        if current.owner != owner and _ms(current.expires_at) > now_ms:
            return None
        epoch = (current.epoch or 0) + 1
        applied = self._lwt(f"take partition {partition}",
                            "UPDATE {ks}.partition_lease SET owner = ?, epoch = ?, expires_at = ?"
                            " WHERE partition = ? IF epoch = ?",
                            (owner, epoch, _ts(expires), partition, current.epoch)).was_applied
        return Lease(partition, owner, epoch, expires) if applied else None

    def renew_lease(self, lease: Lease, ttl_ms: int, now_ms: int) -> Lease | None:
        expires = now_ms + ttl_ms
        applied = self._lwt(f"renew the lease of partition {lease.partition}",
                            "UPDATE {ks}.partition_lease SET expires_at = ? WHERE partition = ?"
                            " IF owner = ? AND epoch = ?",
                            (_ts(expires), lease.partition, lease.owner, lease.epoch)).was_applied
        return Lease(lease.partition, lease.owner, lease.epoch, expires) if applied else None

    def release_lease(self, lease: Lease) -> None:
        self._lwt(f"give up partition {lease.partition}",
                  "UPDATE {ks}.partition_lease SET expires_at = ? WHERE partition = ?"
                  " IF owner = ? AND epoch = ?", (_ts(0), lease.partition, lease.owner, lease.epoch))

    def close(self) -> None:
        self._cluster.shutdown()
