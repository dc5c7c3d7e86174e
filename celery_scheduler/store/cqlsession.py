"""One connection to the scheduler's Cassandra keyspace: prepared statements, batched
concurrent writes stamped with their partition's fence, lightweight transactions, and the
schema. The store (:mod:`celery_scheduler.store.cassandra`) decides what to write; this
module only sends it.
"""

from __future__ import annotations

import collections
import ssl
from collections.abc import Callable, Sequence
from typing import Any

from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import (
    EXEC_PROFILE_DEFAULT,
    Cluster,
    ExecutionProfile,
    ResponseFuture,
    Session,
)
from cassandra.policies import (
    DCAwareRoundRobinPolicy,
    ExponentialReconnectionPolicy,
    TokenAwarePolicy,
)
from cassandra.query import BatchStatement, BatchType

from celery_scheduler.errors import SchemaMissingError
from celery_scheduler.store.cql import Statements, consistency_level, row_factory, translate_errors
from celery_scheduler.store.fencing import FencedTimestamps
from celery_scheduler.store.schema import ADDED_COLUMNS, check_identifier, keyspace_statements

__all__ = ["CONCURRENCY", "CqlSession", "packed"]

# Requests in flight at once for bulk reads and writes.
CONCURRENCY = 64
# Seconds between attempts to reach a node marked down: the driver's default grows to
# 10 minutes, so after a Cassandra restart a dispatcher stayed idle for about as long
# again as the outage lasted; a few seconds cost nothing while it is down.
RECONNECT_DELAYS = (0.5, 5.0)
# Statement sets carrying more blob bytes than this are not sent as one batch (see _grouped).
BATCH_LIMIT_BYTES = 32 * 1024
# Several small statement sets share one batch up to these limits (see _batches).
PACK_STATEMENTS = 10
PACK_BYTES = 4096


# Lightweight transactions use the driver's own row factory: ``was_applied`` accepts only that.
LWT_PROFILE = "celery_scheduler_lwt"



def packed(statement_sets: Sequence[tuple[int, Statements]]) -> list[list[tuple[int, Statements]]]:
    """The (partition, statements) sets grouped into as few requests as they fit.

    Each set goes whole into one group, up to PACK_STATEMENTS statements (so at most that
    many Cassandra partitions, within the server's warning threshold of 10) and PACK_BYTES
    of values (it warns above 5 KiB); a set heavier than that is a group of its own. Each
    request has a fixed cost in the Python driver and in the server, so fewer, fuller
    requests write the same rows faster.
    """
    groups: list[list[tuple[int, Statements]]] = []
    pending: list[tuple[int, Statements]] = []
    count = size = 0
    for partition, statements in statement_sets:
        weight = sum(len(value) for _, params in statements for value in params
                     if isinstance(value, (bytes, str)))
        if weight >= PACK_BYTES:
            groups.append([(partition, statements)])
            continue
        if pending and (count + len(statements) > PACK_STATEMENTS or size + weight > PACK_BYTES):
            groups.append(pending)
            pending, count, size = [], 0, 0
        pending.append((partition, statements))
        count += len(statements)
        size += weight
    if pending:
        groups.append(pending)
    return groups


class CqlSession:
    """The cluster connection of one store, and the ways it sends statements."""

    def __init__(self, contact_points: Sequence[str], keyspace: str, *, port: int,
                 replication: dict[str, Any], consistency: str, serial_consistency: str,
                 username: str | None, password: str | None, use_ssl: bool,
                 request_timeout: float) -> None:
        self.keyspace = check_identifier(keyspace, "keyspace")
        self.replication = replication
        self._consistency = consistency_level(consistency)
        self._serial = consistency_level(serial_consistency)
        auth = PlainTextAuthProvider(username, password) if username else None
        ssl_context = ssl.create_default_context() if use_ssl else None
        profile = ExecutionProfile(load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy()),
                                   consistency_level=self._consistency,
                                   serial_consistency_level=self._serial,
                                   request_timeout=request_timeout, row_factory=row_factory)
        lwt_profile = ExecutionProfile(load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy()),
                                       consistency_level=self._consistency,
                                       serial_consistency_level=self._serial,
                                       request_timeout=request_timeout)
        self._timestamps = FencedTimestamps()
        self._cluster = Cluster(list(contact_points), port=port, auth_provider=auth,
                                ssl_context=ssl_context, connect_timeout=request_timeout,
                                timestamp_generator=self._timestamps,
                                execution_profiles={EXEC_PROFILE_DEFAULT: profile, LWT_PROFILE: lwt_profile},
                                reconnection_policy=ExponentialReconnectionPolicy(*RECONNECT_DELAYS))
        with translate_errors("connect"):
            self.session: Session = self._cluster.connect()
        self._prepared: dict[str, Any] = {}
    def fence_writes(self, fence: Callable[[int], float | None]) -> None:
        self._timestamps.fence = fence

    def prepare(self, cql: str) -> Any:
        statement = self._prepared.get(cql)
        if statement is None:
            with translate_errors("prepare a statement"):
                statement = self.session.prepare(cql.format(ks=self.keyspace))
            statement.consistency_level = self._consistency
            self._prepared[cql] = statement
        return statement

    def create_schema(self) -> None:
        with translate_errors("create the schema"):
            for statement in keyspace_statements(self.keyspace, self.replication):
                self.session.execute(statement, timeout=60)
            self._cluster.control_connection.wait_for_schema_agreement()
            for table, column, cql_type in self.missing_columns():
                self.session.execute(f"ALTER TABLE {self.keyspace}.{table} ADD {column} {cql_type}",
                                      timeout=60)
            self._cluster.control_connection.wait_for_schema_agreement()

    def missing_columns(self) -> list[tuple[str, str, str]]:
        self._cluster.refresh_schema_metadata()
        keyspace = self._cluster.metadata.keyspaces.get(self.keyspace)
        tables = keyspace.tables if keyspace is not None else {}
        return [(table, column, cql_type) for table, column, cql_type in ADDED_COLUMNS
                if table in tables and column not in tables[table].columns]

    def check_schema(self) -> None:
        """Raise SchemaMissingError if the keyspace lacks a column this version writes."""
        with translate_errors("read the schema"):
            missing = self.missing_columns()
        if missing:
            raise SchemaMissingError(
                f"the scheduler's Cassandra schema lacks column(s) "
                f"{', '.join(f'{table}.{column}' for table, column, _ in missing)}, added in this "
                "version; add them with `celery -A <your app> scheduler init` (idempotent)")

    def execute(self, what: str, cql: str, params: tuple[Any, ...],
                 partition: int | None = None) -> Any:
        """Run one statement; a write names the *partition* it belongs to (for its fence)."""
        with translate_errors(what), self._timestamps.writing(partition):
            return self.session.execute(self.prepare(cql), params)

    def batch_statement(self, statements: Statements) -> BatchStatement:
        # Unlogged: every caller retries the whole set until it is acknowledged (ingest does
        # not commit, the engine re-reads), and all writes are idempotent, so the batch log's
        # extra round of writes would buy nothing.
        batch = BatchStatement(batch_type=BatchType.UNLOGGED, consistency_level=self._consistency)
        for cql, params in statements:
            batch.add(self.prepare(cql), params)
        return batch

    def grouped(self, statements: Statements) -> list[Any]:
        """One batch, or, for a set carrying a large envelope, its statements one by one.

        Cassandra refuses batches over its ``batch_size_fail_threshold`` (50 KiB by default)
        whatever the client retries, so a task that large would hold its partition forever.
        Sent separately the writes are just as idempotent, and an unlogged batch of several
        partitions was never atomic anyway.
        """
        size = sum(len(value) for _, params in statements for value in params
                   if isinstance(value, bytes))
        if size < BATCH_LIMIT_BYTES:
            return [self.batch_statement(statements)]
        return [self.prepare(cql).bind(params) for cql, params in statements]

    def batch(self, what: str, partition: int, statements: Statements) -> None:
        self.batches(what, [(partition, statements)])

    def batches(self, what: str, statement_sets: Sequence[tuple[int, Statements]]) -> None:
        """Write each (partition, statements) set, all of them concurrently, as few requests.

        Sets of several partitions share a request when one timestamp is within every one's
        fence (see :mod:`celery_scheduler.store.fencing`); otherwise each partition's sets
        go in requests of their own, stamped no later than its fence.
        """
        sets = [(partition, statements) for partition, statements in statement_sets if statements]
        in_flight: collections.deque[ResponseFuture] = collections.deque()
        with translate_errors(what):
            for group in packed(sets):
                partitions = {partition for partition, _ in group}
                if len(partitions) == 1:
                    self._send_group(group, group[0][0], None, in_flight)
                    continue
                stamp = self._timestamps.shared(partitions)
                if stamp is not None:
                    self._send_group(group, group[0][0], stamp, in_flight)
                    continue
                for partition in sorted(partitions):  # past a fence: partition by partition
                    self._send_group([s for s in group if s[0] == partition], partition, None,
                                     in_flight)
            while in_flight:
                in_flight.popleft().result()

    def _send_group(self, group: list[tuple[int, Statements]], partition: int, stamp: int | None,
                    in_flight: collections.deque[ResponseFuture]) -> None:
        """Send one packed group, keeping at most CONCURRENCY requests in flight.

        Every request is sent from this thread, in the block that names its partition (or
        carries the timestamp shared by its partitions): the driver takes a request's
        timestamp on the thread that sends it.
        """
        statements = [statement for _, part in group for statement in part]
        requests = self.grouped(statements) if len(group) == 1 else [self.batch_statement(statements)]
        for request in requests:
            if len(in_flight) >= CONCURRENCY:
                in_flight.popleft().result()
            with self._timestamps.writing(partition, stamp):
                in_flight.append(self.session.execute_async(request))

    def lwt(self, what: str, cql: str, params: tuple[Any, ...]) -> Any:
        statement = self.prepare(cql)
        statement.serial_consistency_level = self._serial
        with translate_errors(what):
            return self.session.execute(statement, params, execution_profile=LWT_PROFILE)

    def close(self) -> None:
        self._cluster.shutdown()
