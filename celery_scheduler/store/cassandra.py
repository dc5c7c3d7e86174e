"""The schedule store on Apache Cassandra, through cassandra-driver.

Each call asks the lifecycle table what to write (:mod:`celery_scheduler.store.lifecycle`),
turns the transition into statements (:mod:`celery_scheduler.store.cql`) and sends them through its
connection (:mod:`celery_scheduler.store.cqlsession`). Writes use
``scheduler_cassandra_consistency`` (LOCAL_QUORUM by default), so an acknowledged write
survives the loss of a replica. cassandra-driver exceptions are translated into
:mod:`celery_scheduler.errors`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from cassandra.cluster import Cluster, Session
from cassandra.concurrent import execute_concurrent_with_args

from celery_scheduler import clock
from celery_scheduler.decoding import decode_stored
from celery_scheduler.envelope import ScheduleEnvelope
from celery_scheduler.errors import EnvelopeDecodeError
from celery_scheduler.keys import TaskKey
from celery_scheduler.store import lifecycle
from celery_scheduler.store.base import (
    Cursor,
    Operation,
    Put,
    Reschedule,
    Retry,
    ScheduleStore,
    State,
    StoredTask,
    TaskStatus,
)
from celery_scheduler.store.cassandra_audit import Audit
from celery_scheduler.store.cassandra_leases import PartitionLeases
from celery_scheduler.store.cassandra_ledger import LedgerWrites
from celery_scheduler.store.cassandra_limits import RateLimits
from celery_scheduler.store.cassandra_pauses import Pauses
from celery_scheduler.store.cassandra_periodic import PeriodicEntries
from celery_scheduler.store.cassandra_views import OperatorViews
from celery_scheduler.store.cql import (
    INDEX_BUCKET,
    SELECT_STATUS,
    SELECT_STATUSES,
    STATUS_KEY,
    Statements,
    schedule_envelope,
    status_of,
    to_ms,
    to_timestamp,
    transition_statements,
    translate_errors,
)
from celery_scheduler.store.cqlsession import CONCURRENCY, CqlSession, again_if_cut_off
from celery_scheduler.store.lifecycle import Transition
from celery_scheduler.store.schema import TASK_NAMES_TABLE
from celery_scheduler.store.status_layout import StatusLayout

__all__ = ["CassandraScheduleStore", "translate_errors"]

logger = logging.getLogger(__name__)

# Keys a status read asks for at most (of one shard and slot): a long IN list holds one
# request, and its replica, for as long as all of them take.
STATUSES_A_REQUEST = 100
SELECT_NAME = f"SELECT at FROM {{ks}}.{TASK_NAMES_TABLE} WHERE ordering_id = ? AND unique_key = ?"
NAME_KEY = (f"INSERT INTO {{ks}}.{TASK_NAMES_TABLE} (ordering_id, unique_key, at) VALUES (?, ?, ?)"
            " USING TTL ?")


class CassandraScheduleStore(LedgerWrites, OperatorViews, PartitionLeases, PeriodicEntries, Pauses,
                             RateLimits, Audit, ScheduleStore):
    """Pending tasks and task status in one Cassandra keyspace."""

    def __init__(self, contact_points: Sequence[str], keyspace: str, *, port: int = 9042,
                 replication: dict[str, Any] | None = None, consistency: str = "LOCAL_QUORUM",
                 serial_consistency: str = "LOCAL_SERIAL",
                 bucket_seconds: int = 60, status_ttl: int = 7 * 24 * 3600,
                 username: str | None = None, password: str | None = None,
                 use_ssl: bool = False, request_timeout: float = 10.0,
                 status_shards: int = 12) -> None:
        self._cql = CqlSession(contact_points, keyspace, port=port,
                               replication=replication or {"class": "SimpleStrategy",
                                                           "replication_factor": 1},
                               consistency=consistency, serial_consistency=serial_consistency,
                               username=username, password=password, use_ssl=use_ssl,
                               request_timeout=request_timeout)
        self.keyspace = self._cql.keyspace
        self.bucket_seconds = bucket_seconds
        self.status_ttl = status_ttl
        self.status_shards = status_shards  # for a keyspace init creates (see status_layout)
        # buckets this process indexed already: one index write per bucket, not per task
        self._indexed: set[tuple[int, int]] = set()

    @property
    def _session(self) -> Session:
        return self._cql.session

    @property
    def _cluster(self) -> Cluster:
        return self._cql._cluster

    def fence_writes(self, fence: Callable[[int], float | None]) -> None:
        self._cql.fence_writes(fence)

    def refusing_late_writes(self) -> AbstractContextManager[None]:
        return self._cql.refusing_late_writes()

    def create_schema(self, status_shards: int | None = None) -> int:
        return self._cql.create_schema(status_shards or self.status_shards)

    @property
    def layout(self) -> StatusLayout:
        """Where this keyspace keeps each key's status (read from it once)."""
        return self._cql.status_layout()

    def check_schema(self) -> None:
        self._cql.check_schema()

    def drop_schema(self) -> bool:
        return self._cql.drop_keyspace()

    def _written(self, transition: Transition | None) -> Statements:
        """The writes of *transition*, with the bucket index entry of a new row."""
        if transition is None:
            return []
        statements = transition_statements(self.layout, transition, self.status_ttl)
        row = transition.row
        if (row is not None and row.kind is lifecycle.RowKind.INSERT
                and (row.partition, row.bucket) not in self._indexed):
            statements.append((INDEX_BUCKET, (row.partition, row.bucket)))
        return statements

    def _plan_put(self, partition: int, envelope: ScheduleEnvelope, current: TaskStatus | None,
                  now_ms: int, data: bytes | None = None
                  ) -> tuple[Statements, StoredTask | None]:
        transition = lifecycle.scheduled(partition, envelope, current, now_ms, self.bucket_seconds, data)
        return self._written(transition), _row_task(transition)

    def _plan_retry(self, partition: int, key: TaskKey, current: TaskStatus | None, now_ms: int
                    ) -> tuple[Statements, StoredTask | None]:
        """Make a failed *key* pending again, with its attempts so far (see ScheduleStore.retry)."""
        if not lifecycle.may_retry(current):
            return [], None
        row = self.task(key)  # a failed task's row is kept only while it blocks its ordering id
        kept = self.kept_envelope(key) if row is None else None
        transition = lifecycle.retried(partition, current, row, kept, now_ms, self.bucket_seconds)
        return self._written(transition), _row_task(transition)

    def named_keys(self, names: Sequence[tuple[str, str]]) -> dict[tuple[str, str], TaskKey]:
        if not names:
            return {}
        with translate_errors(f"read the keys of {len(names)} task name(s)"):
            answers = again_if_cut_off(lambda: execute_concurrent_with_args(
                self._cql.session, self._cql.prepare(SELECT_NAME), list(names),
                concurrency=CONCURRENCY, raise_on_first_error=True))
        found = {}
        for (ordering_id, unique), (_, result) in zip(names, answers, strict=True):
            row = result.one()
            if row is not None:
                found[(ordering_id, unique)] = TaskKey(ordering_id, to_ms(row.at), unique)
        return found

    def name_keys(self, keys: Sequence[tuple[int, TaskKey]], now_ms: int) -> None:
        # kept for as long as the key's status, once due: its time, then the status TTL
        self._cql.batches(f"name {len(keys)} task(s)", [
            (partition, [(NAME_KEY, (key.ordering_id, key.uniqueness_key,
                                     to_timestamp(key.scheduled_ms),
                                     max(1, (key.scheduled_ms - now_ms) // 1000) + self.status_ttl))])
            for partition, key in keys])

    def kept_envelope(self, key: TaskKey) -> ScheduleEnvelope | None:
        row = self._cql.execute(f"read the kept task of {key}",
                                f"SELECT envelope FROM {{ks}}.key_status WHERE {STATUS_KEY}",
                                self.layout.primary_key(key)).one()
        return schedule_envelope(row)

    def _plan_cancel(self, key: TaskKey, current: TaskStatus | None, now_ms: int
                     ) -> Statements:
        if not lifecycle.may_cancel(current):
            return []
        assert current is not None and current.bucket is not None
        row_kept = True
        if current.state is State.FAILED:  # only a task blocked after its last attempt
            row_kept = self._cql.execute(
                f"read task {key}",
                "SELECT blocked FROM {ks}.schedule WHERE partition = ? AND bucket = ?"
                " AND at = ? AND ordering_id = ? AND unique_key = ?",
                (current.partition, current.bucket, key.scheduled_ms, key.ordering_id,
                 key.uniqueness_key)).one() is not None
        return self._written(lifecycle.cancelled(current, now_ms, row_kept=row_kept))

    def _indexed_now(self, planned: list[StoredTask | None]) -> None:
        if len(self._indexed) > 100_000:
            self._indexed.clear()
        self._indexed.update((t.partition, t.bucket) for t in planned if t is not None)

    def put(self, partition: int, envelope: ScheduleEnvelope, now_ms: int) -> StoredTask | None:
        statements, stored = self._plan_put(partition, envelope, self.status(envelope.key), now_ms)
        if statements:
            self._cql.batch(f"store task {envelope.key}", partition, statements)
            self._indexed_now([stored])
        return stored

    def cancel(self, partition: int, key: TaskKey, now_ms: int) -> bool:
        statements = self._plan_cancel(key, self.status(key), now_ms)
        if statements:
            self._cql.batch(f"cancel task {key}", partition, statements)
        return bool(statements)

    def _plan_reschedule(self, op: Reschedule, current: TaskStatus | None,
                         current_new: TaskStatus | None, now_ms: int
                         ) -> tuple[Statements, Statements, StoredTask | None]:
        """The writes of a reschedule: the old key's move, then the new key's put."""
        moved = None
        if current is not None and current.state is State.RESCHEDULED:
            kept = self.kept_envelope(op.key)  # read again after a failed batch, say
            moved = kept.key if kept is not None else None
        planned = lifecycle.rescheduled(op.partition, current, moved, op.envelope, current_new,
                                        now_ms, self.bucket_seconds, op.data)
        if planned is None:
            return [], [], None
        move, put = planned
        return self._written(move), self._written(put), _row_task(put)

    def reschedule(self, partition: int, key: TaskKey, envelope: ScheduleEnvelope, now_ms: int,
                   data: bytes | None = None) -> StoredTask | None:
        return self.apply([Reschedule(partition, key, envelope, data)], now_ms)[0]  # type: ignore[return-value]

    def retry(self, partition: int, key: TaskKey, now_ms: int) -> StoredTask | None:
        statements, stored = self._plan_retry(partition, key, self.status(key), now_ms)
        if statements:
            self._cql.batch(f"retry task {key}", partition, statements)
            self._indexed_now([stored])
        return stored

    def apply(self, operations: list[Operation], now_ms: int) -> list[StoredTask | bool | None]:
        """Read every key's status concurrently, then write every batch concurrently.

        A reschedule's new key is written after everything else: its move is written first
        (see :meth:`reschedule`).
        """
        if len({op.key for op in operations}) != len(operations):
            raise ValueError("apply() takes at most one operation per task key")
        moving = [op for op in operations if isinstance(op, Reschedule)]
        statuses = self.statuses([op.key for op in operations] + [op.envelope.key for op in moving])
        new_statuses = dict(zip([op.envelope.key for op in moving], statuses[len(operations):],
                                strict=True))
        results: list[StoredTask | bool | None] = []
        statement_sets: list[tuple[int, Statements]] = []
        puts: list[tuple[int, Statements]] = []  # the reschedules' new keys, written last
        for op, current in zip(operations, statuses[:len(operations)], strict=True):
            if isinstance(op, Reschedule):
                statements, put, stored = self._plan_reschedule(
                    op, current, new_statuses[op.envelope.key], now_ms)
                puts.append((op.partition, put))
                results.append(stored)
            elif isinstance(op, Put):
                statements, stored = self._plan_put(op.partition, op.envelope, current, now_ms, op.data)
                results.append(stored)
            elif isinstance(op, Retry):
                statements, stored = self._plan_retry(op.partition, op.key, current, now_ms)
                results.append(stored)
            else:
                statements = self._plan_cancel(op.key, current, now_ms)
                results.append(bool(statements))
            statement_sets.append((op.partition, statements))
        self._cql.batches(f"store {len(operations)} task(s)", statement_sets)
        if any(statements for _, statements in puts):
            self._cql.batches(f"store {len(puts)} rescheduled task(s)", puts)
        self._indexed_now([r for r in results if isinstance(r, StoredTask)])
        return results

    def statuses(self, keys: Sequence[TaskKey]) -> list[TaskStatus | None]:
        """The statuses of *keys*: one request for each (shard, slot) they fall in."""
        if not keys:
            return []
        if len(keys) == 1:
            return [self.status(keys[0])]
        requests = [(shard, slot, [(to_timestamp(k.scheduled_ms), k.ordering_id, k.uniqueness_key)
                                   for k in group[start:start + STATUSES_A_REQUEST]])
                    for (shard, slot), group in self.layout.partitions(dict.fromkeys(keys)).items()
                    for start in range(0, len(group), STATUSES_A_REQUEST)]
        with translate_errors(f"read the status of {len(keys)} task(s)"):
            answers = again_if_cut_off(lambda: execute_concurrent_with_args(
                self._cql.session, self._cql.prepare(SELECT_STATUSES), requests,
                concurrency=CONCURRENCY, raise_on_first_error=True))
        found: dict[TaskKey, TaskStatus | None] = {}
        for _, result in answers:
            for row in result:
                key = TaskKey(row.ordering_id, to_ms(row.at), row.unique_key)
                found[key] = status_of(key, row)
        return [found.get(key) for key in keys]

    def status(self, key: TaskKey) -> TaskStatus | None:
        return status_of(key, self._cql.execute(f"read the status of {key}", SELECT_STATUS,
                                              self.layout.primary_key(key)).one())

    def task(self, key: TaskKey) -> StoredTask | None:
        current = self.status(key)
        if current is None or current.bucket is None:
            return None
        row = self._cql.execute(f"read the row of {key}",
                                "SELECT envelope, attempts, not_before, lease_until, blocked"
                                " FROM {ks}.schedule WHERE partition = ? AND bucket = ? AND at = ?"
                                " AND ordering_id = ? AND unique_key = ?",
                                (current.partition, current.bucket, to_timestamp(key.scheduled_ms),
                                 key.ordering_id, key.uniqueness_key)).one()
        envelope = schedule_envelope(row)
        if envelope is None:
            return None
        return StoredTask(current.partition, current.bucket, envelope, row.attempts or 0,
                          to_ms(row.not_before), to_ms(row.lease_until), bool(row.blocked))

    def buckets(self, partition: int, first: int, last: int, limit: int = 100) -> list[int]:
        rows = self._cql.execute(
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
            rows = list(self._cql.execute(
                    f"read bucket {after.bucket} of partition {partition}",
                    "SELECT at, ordering_id, unique_key, envelope, attempts, not_before, lease_until, blocked"
                    " FROM {ks}.schedule WHERE partition = ? AND bucket = ?"
                    f" AND (at, ordering_id, unique_key) {operator} (?, ?, ?) LIMIT ?",
                    (partition, after.bucket, to_timestamp(position.at_ms), position.ordering_id,
                     position.uniqueness_key, asked)))
            remnants: list[tuple[Any, str | None]] = []
            for row in rows:
                try:
                    envelope = decode_stored(row.envelope) if row.envelope is not None else None
                except EnvelopeDecodeError as exc:
                    remnants.append((row, f"its stored task could not be decoded: {exc}"))
                    continue
                if not isinstance(envelope, ScheduleEnvelope):
                    remnants.append((row, None))
                    continue
                found.append(StoredTask(partition, after.bucket, envelope, row.attempts or 0,
                                        to_ms(row.not_before), to_ms(row.lease_until), bool(row.blocked)))
            if remnants:
                self._settle_remnants(partition, after.bucket, remnants)
            # A short page is the bucket's end only if every row in it was a task: the loader
            # takes fewer rows than it asked for as "nothing more here".
            if not remnants or len(rows) < asked:
                return found
            last = rows[-1]
            position = Cursor(after.bucket, to_ms(last.at), last.ordering_id, last.unique_key)
            operator = ">"

    def _settle_remnants(self, partition: int, bucket: int, remnants: list[tuple[Any, str | None]]
                         ) -> None:
        """Remove rows without a readable task, and give their keys a final status.

        A row without its task is what a dispatch update leaves when it lands just after a
        cancel or a completion (see :func:`settled_state`); a task that cannot be decoded
        (written by an incompatible version) cannot run either, and is recorded as failed.
        """
        keys = [TaskKey(row.ordering_id, to_ms(row.at), row.unique_key) for row, _ in remnants]
        now_ms = clock.now_ms()
        statement_sets: list[tuple[int, Statements]] = []
        for (_, error), key, status in zip(remnants, keys, self.statuses(keys), strict=True):
            logger.warning("removing a schedule row without a runnable task: %s (%s); its status: %s",
                           key, error or "its task was removed by a cancel or a completion",
                           status.state.value if status else "unknown")
            transition = lifecycle.settled(status, partition, bucket, key, error, now_ms)
            statement_sets.append((partition, self._written(transition)))
        self._cql.batches(f"remove {len(remnants)} schedule row(s) without a task", statement_sets)

    def drop_bucket(self, partition: int, bucket: int) -> None:
        self._indexed.discard((partition, bucket))
        self._cql.execute(f"drop bucket {bucket} of partition {partition}",
                          "DELETE FROM {ks}.schedule_buckets WHERE partition = ? AND bucket = ?",
                          (partition, bucket), partition)

    def close(self) -> None:
        self._cql.close()


def _row_task(transition: Transition | None) -> StoredTask | None:
    """The task a transition wrote a row of, if any (a put's or a retry's)."""
    return None if transition is None or transition.row is None else transition.row.task
