"""One connection to the scheduler's Cassandra keyspace: prepared statements, batched
concurrent writes stamped with their partition's fence, lightweight transactions, and the
schema. The store (:mod:`celery_scheduler.store.cassandra`) decides what to write; this
module only sends it.
"""

from __future__ import annotations

import collections
import re
import ssl
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from cassandra import DriverException
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import (
    EXEC_PROFILE_DEFAULT,
    Cluster,
    ExecutionProfile,
    NoHostAvailable,
    ResponseFuture,
    Session,
)
from cassandra.connection import ConnectionException
from cassandra.policies import (
    ConstantSpeculativeExecutionPolicy,
    DCAwareRoundRobinPolicy,
    ExponentialReconnectionPolicy,
    TokenAwarePolicy,
)
from cassandra.query import BatchStatement, BatchType

from celery_scheduler.errors import SchemaMissingError, StoreUnavailableError
from celery_scheduler.store.binding import Binder
from celery_scheduler.store.cql import Statements, consistency_level, row_factory, translate_errors
from celery_scheduler.store.fencing import FencedTimestamps
from celery_scheduler.store.packing import Write, packed, weight_of
from celery_scheduler.store.schema import (
    LEASES_TABLE,
    OLD_STATUS_TABLE,
    OPERATOR_LOG_TABLE,
    PAUSES_TABLE,
    RATE_LIMITS_TABLE,
    TASK_NAMES_TABLE,
    check_identifier,
    keyspace_statements,
)
from celery_scheduler.store.status_layout import DEFAULT_SLOT_SECONDS, StatusLayout
from celery_scheduler.store.upgrade import move_old_statuses

__all__ = ["CONCURRENCY", "CqlSession", "again_if_cut_off", "idempotent", "profiles"]

T = TypeVar("T")

# Requests in flight at once for bulk reads and writes.
CONCURRENCY = 64
# Seconds between attempts to reach a node marked down: the driver's default grows to
# 10 minutes, so after a Cassandra restart a dispatcher stayed idle for about as long
# again as the outage lasted. At most a second: with 5 s, a dispatcher found the node back
# 2.5 s after its restart on average (the long chaos run's tail of lateness after Cassandra
# restarts), and an attempt a second at a node that is down costs nothing.
RECONNECT_DELAYS = (0.5, 1.0)
# A node that stalls (a long GC pause, a disk that hangs) answers nothing until the request
# times out; every request it coordinates or is asked to replicate waits that long. An
# idempotent request not answered within SPECULATE_AFTER_SECONDS is sent to the next replica
# too, up to SPECULATIVE_ATTEMPTS more times, and the first answer wins; a write sent twice
# carries one timestamp, so it lands once. Lightweight transactions are never sent twice:
# they wait at most LWT_TIMEOUT_SECONDS, so that a lease renewal coordinated by a stalled
# node fails in time to be tried again, elsewhere, before the lease runs out.
SPECULATE_AFTER_SECONDS = 0.5
SPECULATIVE_ATTEMPTS = 2
LWT_TIMEOUT_SECONDS = 3.0
# Speculation still costs half a second on every request whose first choice is the stalled
# node, and a lease renewal it coordinates fails after LWT_TIMEOUT_SECONDS: through a 30 s
# stall, a dispatcher spent 18 of 32 s renewing leases and released almost nothing, since
# the driver kept the node up (nothing but a heartbeat marks a node down, and by default
# one goes out after 30 s of silence and waits 30 s). A connection that has heard nothing
# for HEARTBEAT_SECONDS is asked for an answer, and one that gives none within
# HEARTBEAT_TIMEOUT_SECONDS is closed and its node marked down, so that requests go to the
# others; the reconnection policy brings it back once it answers. A busy connection hears
# answers all the time and sends no heartbeat.
HEARTBEAT_SECONDS = 1.0
HEARTBEAT_TIMEOUT_SECONDS = 2.0

# Lightweight transactions use the driver's own row factory: ``was_applied`` accepts only that.
LWT_PROFILE = "celery_scheduler_lwt"
_CONDITION = re.compile(r"\bIF\b", re.IGNORECASE)


def idempotent(cql: str) -> bool:
    """Whether applying *cql* twice does what applying it once does: every statement the
    store sends is, with its client-side timestamp, but a conditional one (a lightweight
    transaction, whose second try would find its own first write)."""
    return _CONDITION.search(cql) is None


def again_if_cut_off(call: Callable[[], T]) -> T:
    """*call* (idempotent requests only), made once more if it failed because the connection
    it waited on was closed under it.

    When a heartbeat finds a node stalled, the driver closes its connection and fails every
    request waiting on it; one whose other tries had already been used (speculation) failed
    with no host left to try, though two nodes were up: 3 of 51,064 reads through three
    stalls. Made again, it goes to the nodes that answer.
    """
    try:
        return call()
    except NoHostAvailable as exc:
        errors = list(exc.errors.values()) if isinstance(exc.errors, dict) else []
        if not errors or not all(isinstance(error, ConnectionException) for error in errors):
            raise
        return call()


def profiles(consistency: int, serial: int, request_timeout: float) -> dict[Any, ExecutionProfile]:
    """The driver's execution profiles: the default one, and the lightweight transactions'."""
    def routing() -> TokenAwarePolicy:
        # the replicas in turn, not always the first: a stalled one is not every request's coordinator
        return TokenAwarePolicy(DCAwareRoundRobinPolicy(), shuffle_replicas=True)

    default = ExecutionProfile(
        load_balancing_policy=routing(), consistency_level=consistency,
        serial_consistency_level=serial, request_timeout=request_timeout, row_factory=row_factory,
        speculative_execution_policy=ConstantSpeculativeExecutionPolicy(
            SPECULATE_AFTER_SECONDS, SPECULATIVE_ATTEMPTS))
    lwt = ExecutionProfile(load_balancing_policy=routing(), consistency_level=consistency,
                           serial_consistency_level=serial,
                           request_timeout=min(request_timeout, LWT_TIMEOUT_SECONDS))
    return {EXEC_PROFILE_DEFAULT: default, LWT_PROFILE: lwt}


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
        self._timestamps = FencedTimestamps()
        self._cluster = Cluster(list(contact_points), port=port, auth_provider=auth,
                                ssl_context=ssl_context, connect_timeout=request_timeout,
                                timestamp_generator=self._timestamps,
                                execution_profiles=profiles(self._consistency, self._serial,
                                                            request_timeout),
                                reconnection_policy=ExponentialReconnectionPolicy(*RECONNECT_DELAYS),
                                idle_heartbeat_interval=HEARTBEAT_SECONDS,
                                idle_heartbeat_timeout=HEARTBEAT_TIMEOUT_SECONDS)
        with translate_errors("connect"):
            self.session: Session = self._cluster.connect()
        self._prepared: dict[str, Any] = {}
        self._binders: dict[str, Binder] = {}
        self._layout: StatusLayout | None = None
        self._tables: dict[bytes, str] = {}  # a prepared statement's table, by its id

    def fence_writes(self, fence: Callable[[int], float | None]) -> None:
        self._timestamps.fence = fence

    def refusing_late_writes(self) -> AbstractContextManager[None]:
        """See :meth:`FencedTimestamps.refusing_late`."""
        return self._timestamps.refusing_late()

    def prepare(self, cql: str) -> Any:
        statement = self._prepared.get(cql)
        if statement is None:
            with translate_errors("prepare a statement"):
                statement = self.session.prepare(cql.format(ks=self.keyspace))
            statement.consistency_level = self._consistency
            statement.is_idempotent = idempotent(cql)
            self._prepared[cql] = statement
        return statement

    def create_schema(self, status_shards: int) -> int:
        """Create what is missing; a keyspace made by an earlier version gets its statuses moved."""
        with translate_errors("create the schema"):
            for statement in keyspace_statements(self.keyspace, self.replication):
                self.session.execute(statement, timeout=60)
            self._cluster.control_connection.wait_for_schema_agreement()
            # written once: every reader must find a key's status where it was written
            self.session.execute(
                f"INSERT INTO {self.keyspace}.status_layout (id, shards, slot_seconds)"
                " VALUES (0, %s, %s) IF NOT EXISTS", (status_shards, DEFAULT_SLOT_SECONDS),
                execution_profile=LWT_PROFILE, timeout=60)
        if self._has_table(OLD_STATUS_TABLE):
            return move_old_statuses(self.session, self.keyspace, self.status_layout())
        return 0

    def drop_keyspace(self) -> bool:
        """``DROP KEYSPACE``; False if it did not exist."""
        with translate_errors("drop the keyspace"):
            self._cluster.refresh_schema_metadata()
            existed = self.keyspace in self._cluster.metadata.keyspaces
            self.session.execute(f"DROP KEYSPACE IF EXISTS {self.keyspace}", timeout=60)
            self._cluster.control_connection.wait_for_schema_agreement()
        return existed

    def _has_table(self, table: str) -> bool:
        try:
            self._cluster.refresh_schema_metadata()
        except DriverException as exc:
            # the driver's control connection lost its node (a restart under way): an
            # outage, waited out at start like any other
            raise StoreUnavailableError(f"Cassandra could not read the schema: {exc}") from exc
        keyspace = self._cluster.metadata.keyspaces.get(self.keyspace)
        return keyspace is not None and table in keyspace.tables

    def _has_column(self, table: str, column: str) -> bool:
        keyspace = self._cluster.metadata.keyspaces.get(self.keyspace)
        found = keyspace.tables.get(table) if keyspace is not None else None
        return found is not None and column in found.columns

    def check_schema(self) -> None:
        """Raise SchemaMissingError if the keyspace is not the one this version writes."""
        with translate_errors("read the schema"):
            old = self._has_table(OLD_STATUS_TABLE)
        if old:
            raise SchemaMissingError(
                f"the scheduler's Cassandra keyspace {self.keyspace!r} keeps task statuses in "
                f"{OLD_STATUS_TABLE!r}, as earlier versions did; stop the dispatchers and run "
                "`celery -A <your app> scheduler init`, which moves them to 'key_status'")
        for table, kept in ((LEASES_TABLE, "partition leases"), (PAUSES_TABLE, "operators' pauses"),
                            (RATE_LIMITS_TABLE, "operators' rate limits"),
                            (TASK_NAMES_TABLE, "the keys of tasks scheduled with their own task id"),
                            (OPERATOR_LOG_TABLE, "the operators' log")):
            with translate_errors("read the schema"):
                present = self._has_table(table)
            if not present:
                raise SchemaMissingError(
                    f"the scheduler's Cassandra keyspace {self.keyspace!r} has no {table!r} "
                    f"table, where this version keeps {kept}; run "
                    "`celery -A <your app> scheduler init` to add it (dispatchers of the earlier "
                    "version may keep running meanwhile)")
        if not self._has_column("key_status", "outcome_generation"):
            raise SchemaMissingError(
                f"the scheduler's Cassandra keyspace {self.keyspace!r} has no "
                "key_status.outcome_generation column, which this version writes with each "
                "outcome; run `celery -A <your app> scheduler init` to add it (dispatchers of "
                "the earlier version may keep running meanwhile)")
        self.status_layout()

    def status_layout(self) -> StatusLayout:
        """The keyspace's status layout, as ``init`` wrote it (read once)."""
        if self._layout is None:
            row = self.execute("read the status layout",
                               "SELECT shards, slot_seconds FROM {ks}.status_layout WHERE id = 0",
                               ()).one()
            if row is None or not row.shards or not row.slot_seconds:
                raise SchemaMissingError(
                    f"the scheduler's Cassandra keyspace {self.keyspace!r} has no status layout; "
                    "create it with `celery -A <your app> scheduler init`")
            self._layout = StatusLayout(row.shards, row.slot_seconds)
        return self._layout

    def execute(self, what: str, cql: str, params: tuple[Any, ...],
                 partition: int | None = None) -> Any:
        """Run one statement; a write names the *partition* it belongs to (for its fence)."""
        statement = self.prepare(cql)
        with translate_errors(what), self._timestamps.writing(partition):
            if not statement.is_idempotent:
                return self.session.execute(statement, params)
            return again_if_cut_off(lambda: self.session.execute(statement, params))

    def batch(self, what: str, partition: int, statements: Statements) -> None:
        self.batches(what, [(partition, statements)])

    def writes(self, statement_sets: Sequence[tuple[int, Statements]]) -> list[Write]:
        """Each statement bound, with the Cassandra partition it writes."""
        found = []
        for partition, statements in statement_sets:
            for cql, params in statements:
                binder = self._binders.get(cql)
                if binder is None:
                    binder = self._binders[cql] = Binder(self.prepare(cql))
                prepared = binder.prepared
                bound = binder.bind(params)
                table = self._tables.get(prepared.query_id)
                if table is None:
                    table = self._tables[prepared.query_id] = prepared.column_metadata[0].table_name
                found.append(Write(partition, (table, bound.routing_key), weight_of(params), bound))
        return found

    def batches(self, what: str, statement_sets: Sequence[tuple[int, Statements]]) -> None:
        """Write each (partition, statements) set, all of them concurrently, as few requests.

        Writes of several partitions share a request when one timestamp is within every
        one's fence (see :mod:`celery_scheduler.store.fencing`); otherwise each partition's
        writes go in requests of their own, stamped no later than its fence. Every caller
        sends a set again until it is acknowledged whole, and every write is idempotent, so
        a set may be spread over requests (an unlogged batch of several Cassandra partitions
        is not atomic either).
        """
        writes = self.writes(statement_sets)
        with translate_errors(what):
            again_if_cut_off(lambda: self._send_all(writes))

    def _send_all(self, writes: list[Write]) -> None:
        in_flight: collections.deque[ResponseFuture] = collections.deque()
        for request in packed(writes):
            partitions = {write.partition for write in request}
            if len(partitions) == 1:
                self._send(request, request[0].partition, None, in_flight)
                continue
            stamp = self._timestamps.shared(partitions)
            if stamp is not None:
                self._send(request, request[0].partition, stamp, in_flight)
                continue
            for partition in sorted(partitions):  # past a fence: partition by partition
                self._send([w for w in request if w.partition == partition], partition, None,
                           in_flight)
        while in_flight:
            in_flight.popleft().result()

    def _send(self, request: list[Write], partition: int, stamp: int | None,
              in_flight: collections.deque[ResponseFuture]) -> None:
        """Send one request (a batch, or a lone statement), keeping at most CONCURRENCY in flight.

        Every request is sent from this thread, in the block that names its partition (or
        carries the timestamp shared by its partitions): the driver takes a request's
        timestamp on the thread that sends it.
        """
        if len(request) == 1:
            statement = request[0].statement
        else:
            statement = BatchStatement(batch_type=BatchType.UNLOGGED, consistency_level=self._consistency)
            for write in request:
                statement.add(write.statement)
            statement.is_idempotent = all(write.statement.is_idempotent for write in request)
        if len(in_flight) >= CONCURRENCY:
            in_flight.popleft().result()
        with self._timestamps.writing(partition, stamp):
            in_flight.append(self.session.execute_async(statement))

    def lwt(self, what: str, cql: str, params: tuple[Any, ...]) -> Any:
        statement = self.prepare(cql)
        statement.serial_consistency_level = self._serial
        with translate_errors(what):
            return self.session.execute(statement, params, execution_profile=LWT_PROFILE)

    def conditional_batch(self, what: str, statements: Statements) -> bool:
        """Apply *statements*, conditional writes of one Cassandra partition, as one lightweight
        transaction: all of them if every condition holds, else none. Whether they were."""
        batch = BatchStatement(consistency_level=self._consistency,
                               serial_consistency_level=self._serial)
        for cql, params in statements:
            batch.add(self.prepare(cql), params)
        with translate_errors(what):
            return bool(self.session.execute(batch, execution_profile=LWT_PROFILE).was_applied)

    def close(self) -> None:
        self._cluster.shutdown()
