"""What reading task statuses costs, one key a request or many keys of one partition a request.

::

    python -m benchmarks.status_reads [--keys 6000] [--group 20,100]

Ingest reads a key's status before it writes the key. Earlier versions' ``task_status`` had
one Cassandra partition per task key, so every read was a request of its own; this measures
that read against the layout of ``key_status``, where the statuses of one Kafka partition's
time slot share a Cassandra partition, read with ``(at, ordering_id, unique_key) IN ?`` for
a group of keys. Both tables
are made in a keyspace of their own on the local Cassandra (dropped at the end), hold half
of the keys asked for (the other half are new keys, as on ingest), and are read with the
package's row factory. Prints CPU per key of this process (the driver) and of Cassandra.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import time
import uuid
from collections.abc import Callable
from typing import Any

from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
from cassandra.concurrent import execute_concurrent_with_args

from benchmarks.cpu import _cpu_seconds, local_services
from celery_scheduler.store.cql import row_factory

__all__ = ["main"]

PARTITIONS = 12


def _measure(label: str, read: Callable[[], Any], keys: int, cassandra: list[int]) -> None:
    read()  # warmed up: statements prepared, pages cached
    cassandra_before, before, started = _cpu_seconds(cassandra), time.process_time(), time.monotonic()
    read()
    client = (time.process_time() - before) / keys * 1e6
    server = (_cpu_seconds(cassandra) - cassandra_before) / keys * 1e6
    wall = (time.monotonic() - started) / keys * 1e6
    print(f"{label}: driver {client:,.0f} us, Cassandra {server:,.0f} us CPU a key; "
          f"{wall:,.0f} us a key of wall time", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.status_reads", description=__doc__)
    parser.add_argument("--keys", type=int, default=6000, help="keys read (half of them exist)")
    parser.add_argument("--group", default="20,100", help="keys a request, partition layout")
    options = parser.parse_args(argv)
    cassandra = local_services().get("Cassandra", [])
    if not cassandra:
        raise SystemExit("no local Cassandra on port 9042: scripts/services up")
    keyspace = f"bench_reads_{uuid.uuid4().hex[:8]}"
    cluster = Cluster(["127.0.0.1"], execution_profiles={
        EXEC_PROFILE_DEFAULT: ExecutionProfile(row_factory=row_factory)})
    session = cluster.connect()
    try:
        session.execute(f"CREATE KEYSPACE {keyspace} WITH replication = "
                        "{'class': 'SimpleStrategy', 'replication_factor': 1}")
        session.execute(f"CREATE TABLE {keyspace}.per_key (ordering_id text, at timestamp, "
                        "unique_key text, state text, attempts int, "
                        "PRIMARY KEY ((ordering_id, at, unique_key)))")
        session.execute(f"CREATE TABLE {keyspace}.per_bucket (partition int, bucket bigint, "
                        "at timestamp, ordering_id text, unique_key text, state text, attempts int,"
                        " PRIMARY KEY ((partition, bucket), at, ordering_id, unique_key))")
        base = dt.datetime(2030, 1, 1)
        keys = [(f"o{i % 1000}", base + dt.timedelta(milliseconds=10 * i), f"u{i}")
                for i in range(options.keys)]
        existing = keys[::2]
        execute_concurrent_with_args(session, session.prepare(
            f"INSERT INTO {keyspace}.per_key (ordering_id, at, unique_key, state, attempts)"
            " VALUES (?, ?, ?, 'pending', 0)"), existing, concurrency=64)
        execute_concurrent_with_args(session, session.prepare(
            f"INSERT INTO {keyspace}.per_bucket (partition, bucket, at, ordering_id, unique_key,"
            " state, attempts) VALUES (?, 0, ?, ?, ?, 'pending', 0)"),
            [(i % PARTITIONS, at, ordering, unique) for i, (ordering, at, unique)
             in enumerate(existing)], concurrency=64)
        one = session.prepare(f"SELECT state, attempts FROM {keyspace}.per_key"
                              " WHERE ordering_id = ? AND at = ? AND unique_key = ?")
        _measure("one key a request (the earlier task_status)",
                 lambda: execute_concurrent_with_args(session, one, keys, concurrency=64),
                 len(keys), cassandra)
        grouped = session.prepare(
            f"SELECT at, ordering_id, unique_key, state, attempts FROM {keyspace}.per_bucket"
            " WHERE partition = ? AND bucket = 0 AND (at, ordering_id, unique_key) IN ?")
        for size in (int(g) for g in options.group.split(",")):
            requests: list[tuple[Any, ...]] = []
            for number in range(PARTITIONS):
                mine = [(at, ordering, unique) for i, (ordering, at, unique) in enumerate(keys)
                        if i % PARTITIONS == number]
                requests += [(number, mine[j:j + size]) for j in range(0, len(mine), size)]
            _measure(f"{size} keys of one partition a request",
                     functools.partial(execute_concurrent_with_args, session, grouped, requests,
                                       concurrency=16),
                     len(keys), cassandra)
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)
        cluster.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
