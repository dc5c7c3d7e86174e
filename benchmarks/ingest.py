"""Scenario 2: dispatcher ingest, from Kafka to Cassandra, persisted and committed.

The tasks are produced first with no dispatcher running; a dispatcher is then started and
the rate is taken from the group's committed offsets (a record counts once its offset is
committed, which the dispatcher does only after Cassandra acknowledged the batch), over the
time from the dispatcher's launch (start-up included) and, apart, from its first commit. The
baseline is plain cassandra-driver writing the same two rows per task (schedule row and
status row) the strongest simple way: unlogged batches of rows that share a Cassandra
partition, many in flight; individual concurrent inserts are shown beside it.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import psutil
from cassandra.cluster import Cluster, Session
from cassandra.concurrent import execute_concurrent, execute_concurrent_with_args
from cassandra.query import BatchStatement, BatchType, PreparedStatement

from benchmarks.context import Context, utc
from benchmarks.harness import Stack, committed_and_end, stack
from benchmarks.report import Section
from benchmarks.stats import Figure, ratio
from celery_scheduler.keys import TaskKey
from celery_scheduler.store.base import write_bucket
from celery_scheduler.store.cql import PENDING_STATUS
from celery_scheduler.store.status_layout import StatusLayout

__all__ = ["run"]

CASSANDRA_HOST = "127.0.0.1"
CONCURRENCY = 64  # requests in flight, as the store's own bulk writes
ORDERING_IDS = 1000
ROWS_PER_BATCH = 24  # rows of one Cassandra partition in one unlogged batch, at most


def produce(app: Any, first: int, count: int, at: float, spread: float = 0.0) -> None:
    """Schedule tasks first..first+count-1 due from *at* on (batched form), then flush."""
    from celery_scheduler import flush

    for i in range(first, first + count):
        due = at + spread * (i - first) / max(count, 1)
        app.record.schedule((f"o{i % ORDERING_IDS}", i, due), {}, at=utc(due), wait=False)
    if flush(app.app, 120):
        raise RuntimeError("records left unacknowledged after 120 s")


def _ingest_once(s: Stack, window: float) -> tuple[float, float, float]:
    """Start a dispatcher on a topic with a backlog; return (records/s from its launch,
    records/s from its first commit, peak RSS MB).

    The rates are taken until the backlog is committed, or for at most *window* seconds after
    the first commit.
    """
    group = f"{s.name}.dispatchers"
    start_committed, end = committed_and_end(s.name, group, s.partitions)
    launched = time.monotonic()
    dispatcher = s.dispatcher(wait=False)
    process = psutil.Process(dispatcher.pid)
    peak = 0
    first: tuple[float, int] | None = None
    give_up = time.monotonic() + window + 120  # start-up included
    while True:
        peak = max(peak, sum(p.memory_info().rss for p in [process, *process.children(recursive=True)]))
        committed, _ = committed_and_end(s.name, group, s.partitions)
        now = time.monotonic()
        if first is None and committed > start_committed:
            first = (now, committed)
        if committed >= end or (first is not None and now - first[0] >= window):
            break
        if now > give_up:
            raise RuntimeError(f"nothing committed {window + 120:.0f}s after the dispatcher started")
        s.check_alive()
        time.sleep(0.2)
    s.stop(dispatcher)
    if first is None or now <= first[0]:
        raise RuntimeError("the whole backlog was committed between two polls; produce more records")
    return ((committed - start_committed) / (now - launched),
            (committed - first[1]) / (now - first[0]), peak / 2**20)


def _batched(session: Session, params: list[tuple[PreparedStatement, tuple[Any, ...]]]) -> None:
    """Write *params* as unlogged batches of rows that share a Cassandra partition."""
    groups: dict[tuple[Any, ...], list[tuple[PreparedStatement, tuple[Any, ...]]]] = {}
    for statement, args in params:
        # both tables are partitioned by their first two columns
        groups.setdefault((id(statement), args[0], args[1]), []).append((statement, args))
    batches: list[tuple[BatchStatement, None]] = []
    for rows in groups.values():
        for start in range(0, len(rows), ROWS_PER_BATCH):
            batch = BatchStatement(batch_type=BatchType.UNLOGGED,
                                   consistency_level=rows[0][0].consistency_level)
            for statement, args in rows[start:start + ROWS_PER_BATCH]:
                batch.add(statement, args)
            batches.append((batch, None))
    execute_concurrent(session, batches, concurrency=CONCURRENCY, raise_on_first_error=True)


def _raw_inserts(keyspace: str, value: bytes, count: int, bucket_seconds: int
                 ) -> tuple[float, float]:
    """(tasks/s as unlogged batches of one Cassandra partition's rows, tasks/s as single
    inserts) of *count* tasks each, two rows a task, in the store's buckets."""
    cluster = Cluster([CASSANDRA_HOST])
    try:
        session = cluster.connect()
        session.execute(f"CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = "
                        "{'class': 'SimpleStrategy', 'replication_factor': 1}", timeout=60)
        session.execute(f"""CREATE TABLE IF NOT EXISTS {keyspace}.schedule (partition int, bucket bigint,
            at timestamp, ordering_id text, unique_key text, task text, envelope blob, attempts int,
            not_before timestamp, lease_until timestamp, blocked boolean,
            PRIMARY KEY ((partition, bucket), at, ordering_id, unique_key))""", timeout=60)
        session.execute(f"""CREATE TABLE IF NOT EXISTS {keyspace}.key_status (shard int, slot bigint,
            at timestamp, ordering_id text, unique_key text, state text, task text, partition int,
            bucket bigint, attempts int, last_error text, outcome text, outcome_attempt int,
            updated_at timestamp, PRIMARY KEY ((shard, slot), at, ordering_id, unique_key))""",
                        timeout=60)
        cluster.control_connection.wait_for_schema_agreement()
        row = session.prepare(f"INSERT INTO {keyspace}.schedule (partition, bucket, at, ordering_id,"
                              " unique_key, task, envelope, attempts, not_before, lease_until, blocked)"
                              " VALUES (?, ?, ?, ?, ?, ?, ?, 0, null, null, false)")
        status = session.prepare(PENDING_STATUS.format(ks=keyspace))
        layout = StatusLayout(12)
        for statement in (row, status):
            statement.consistency_level = 6  # LOCAL_QUORUM, the store's default
        at = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=7)
        now = dt.datetime.now(dt.timezone.utc)
        now_ms = int(now.timestamp() * 1000)

        def rows(first: int) -> list[tuple[PreparedStatement, tuple[Any, ...]]]:
            params: list[tuple[PreparedStatement, tuple[Any, ...]]] = []
            for i in range(first, first + count):
                # due over one day, as the ingest run's tasks, in the buckets the store uses
                o, u, p = f"o{i % ORDERING_IDS}", f"s{i}", i % 12
                when = at + dt.timedelta(seconds=86_400 * (i - first) / count, microseconds=i)
                key = TaskKey(o, int(when.timestamp() * 1000), u)
                b = write_bucket(key.scheduled_ms, now_ms, bucket_seconds)
                params.append((row, (p, b, when, o, u, "bench.record", value)))
                params.append((status, (*layout.primary_key(key), "pending", "bench.record", p, b,
                                        0, None, None, 0, now, 0)))
            return params

        batched_rows, single_rows = rows(0), rows(count)
        started = time.perf_counter()
        _batched(session, batched_rows)
        batched = count / (time.perf_counter() - started)
        started = time.perf_counter()
        for statement in (row, status):  # interleaved would be the same work; two passes are simpler
            execute_concurrent_with_args(session, statement,
                                         [args for s, args in single_rows if s is statement],
                                         concurrency=CONCURRENCY, raise_on_first_error=True)
        return batched, count / (time.perf_counter() - started)
    finally:
        cluster.shutdown()


def _drop_keyspace(keyspace: str) -> None:
    cluster = Cluster([CASSANDRA_HOST])
    try:
        cluster.connect().execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=120)
    finally:
        cluster.shutdown()


def run(ctx: Context) -> list[Section]:
    count = ctx.pick(2_000, 20_000)
    window = ctx.pick(3, 30)
    runs = ctx.pick(2, 3)
    section = Section("2", "Dispatcher ingest: Kafka to Cassandra, persisted and committed")
    ours, steady, raw, single, rss = [], [], [], [], []
    with stack(ctx.tmp) as s:
        app = s.use_client()
        at = time.time() + 7 * 86_400
        value = s._client.encode(app.record.build(("o999", count, at), {}, at=utc(at)))
        raw_keyspace = f"{s.name}_raw"
        try:
            for run_index in range(runs):
                produce(app, run_index * count, count, at, spread=86_400)
                rate, rate_after_first, peak = _ingest_once(s, window)
                ours.append(rate)
                steady.append(rate_after_first)
                rss.append(peak)
                batched, one_by_one = _raw_inserts(raw_keyspace, value, count // 2,
                                                   s._client.settings.bucket_seconds)
                raw.append(batched)
                single.append(one_by_one)
        finally:
            _drop_keyspace(raw_keyspace)
    ratios = [ratio(a, b) for a, b in zip(ours, raw, strict=True)]
    section.add("dispatcher ingest, persisted and committed, from launch", Figure.of(ours, "tasks/s"))
    section.add("... from its first commit", Figure.of(steady, "tasks/s"))
    section.add("raw Cassandra writes, same rows, batched by Cassandra partition",
                Figure.of(raw, "tasks/s"))
    section.add("raw Cassandra writes, same rows, one insert each", Figure.of(single, "tasks/s"))
    section.add("ratio to raw batched writes (from launch)", Figure.of(ratios, "%"),
                "≥ 70% in every run", Figure.of(ratios).low >= 0.7)
    section.add("dispatcher peak RSS during ingest", Figure.of(rss, "MB"))
    section.method = [
        f"{count:,} tasks per run (due over one day, a week ahead, {ORDERING_IDS} ordering ids, 12 "
        "partitions) produced while no dispatcher runs; then one dispatcher is launched and the "
        "group's committed offsets are polled every 0.2 s; rate = records committed / time since "
        f"the launch (start-up included), until all are committed or for {window} s at most "
        "after the first commit; the rate after the first commit is shown apart.",
        "raw: one cassandra-driver session, prepared statements, LOCAL_QUORUM, "
        f"{CONCURRENCY} requests in flight, {count // 2:,} tasks per run and form, two rows per "
        "task (schedule row with the same envelope bytes, status row) into tables shaped like the "
        "scheduler's, in a keyspace of its own; batched: the rows grouped by Cassandra partition "
        f"into unlogged batches of at most {ROWS_PER_BATCH} (the target's baseline); single: "
        "one insert a row.",
        "the raw rows are written after each ingest run, not during it.",
    ]
    return [section]
