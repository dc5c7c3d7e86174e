"""CQL for the scheduler's keyspace, created by ``celery -A proj scheduler init``.

``schedule`` holds pending tasks as wide rows per (Kafka partition, time bucket), clustered
by time then key, so a dispatcher reads its partitions forward in time one bucket at a
time. ``key_status`` holds one row per task key, in Cassandra partitions of (shard, slot)
that follow from the key (:mod:`celery_scheduler.store.status_layout`, whose numbers
``status_layout`` keeps); finished rows expire after ``scheduler_status_ttl`` seconds. A
failed task's row keeps its envelope (unless its schedule row is kept, blocked), so
``scheduler retry`` can run it again.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from celery_scheduler.errors import ConfigurationError

__all__ = [
    "CHANGES_TABLE",
    "FIRED_TABLE",
    "LEASES_TABLE",
    "OLD_LEASE_TABLE",
    "OLD_STATUS_TABLE",
    "OPERATOR_LOG_DAYS",
    "OPERATOR_LOG_TABLE",
    "PAUSES_TABLE",
    "RATE_LIMITS_TABLE",
    "STATUS_COLUMNS",
    "TASK_NAMES_TABLE",
    "check_identifier",
    "keyspace_statements",
]

# Where earlier versions kept statuses, one Cassandra partition a key: ``init`` copies its
# rows into key_status, and a dispatcher refuses to start while it is there.
OLD_STATUS_TABLE = "task_status"
# Where partition leases are kept: every lease in one Cassandra partition (``ring``), so one
# conditional batch, a single lightweight transaction, renews all of a dispatcher's leases.
LEASES_TABLE = "leases"
# Where earlier versions kept them, one Cassandra partition (and one lightweight transaction
# a renewal) per partition. Dispatchers of this version retire each partition's row there
# before leasing it (see store/cassandra_leases.py), so that one of an earlier version,
# still running during an upgrade, can never take it.
OLD_LEASE_TABLE = "partition_lease"
# What each periodic entry fired last, by the Kafka partition that fires it.
FIRED_TABLE = "periodic_fired"
# The periodic entries changed at run time (paused, deleted, added): few, in one partition.
CHANGES_TABLE = "periodic_changes"
# The operators' pauses: few, in one partition.
PAUSES_TABLE = "pauses"
# The key a task that carries its own Celery task id was last scheduled under, by its ordering
# id and uniqueness key (see TaskWriter.named_keys).
TASK_NAMES_TABLE = "task_names"
# The operators' rate limits: few, in one partition.
RATE_LIMITS_TABLE = "rate_limits"
# The operators' log: a partition a month, newest first, each row kept this many days.
OPERATOR_LOG_TABLE = "operator_log"
OPERATOR_LOG_DAYS = 90
# The columns of a status besides its key, as both tables name them (the old table may
# lack the last four, added to it after its first version).
STATUS_COLUMNS = ("state", "task", "partition", "bucket", "attempts", "last_error", "outcome",
                  "outcome_attempt", "updated_at", "envelope", "released_at", "started_at",
                  "finished_at")

_IDENTIFIER = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,47}$")


def check_identifier(name: str, what: str) -> str:
    """Return *name* if it is a plain CQL identifier (it is spliced into statements)."""
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        raise ConfigurationError(
            f"{what} {name!r} is not a valid Cassandra name: use a letter followed by up to "
            "47 letters, digits or underscores"
        )
    return name


def _replication_literal(replication: Mapping[str, Any]) -> str:
    if "class" not in replication:
        raise ConfigurationError(
            f"scheduler_cassandra_replication needs a 'class', got {dict(replication)!r}"
        )
    entries = []
    for name, value in replication.items():
        if (not isinstance(name, str) or isinstance(value, bool)
                or not isinstance(value, (str, int)) or "'" in name or "'" in str(value)):
            raise ConfigurationError(
                "scheduler_cassandra_replication entries must be text or integers without "
                f"quotes, got {name!r}: {value!r}"
            )
        entries.append(f"'{name}': '{value}'")
    return "{" + ", ".join(entries) + "}"


def keyspace_statements(keyspace: str, replication: Mapping[str, Any]) -> list[str]:
    """Return the idempotent statements that create the keyspace and its tables."""
    ks = check_identifier(keyspace, "keyspace")
    return [
        f"CREATE KEYSPACE IF NOT EXISTS {ks} WITH replication = {_replication_literal(replication)}",
        # pending tasks, and the dispatch state of each (attempts, backoff, lease)
        f"""CREATE TABLE IF NOT EXISTS {ks}.schedule (
            partition int,
            bucket bigint,
            at timestamp,
            ordering_id text,
            unique_key text,
            task text,
            envelope blob,
            attempts int,
            not_before timestamp,
            lease_until timestamp,
            blocked boolean,
            PRIMARY KEY ((partition, bucket), at, ordering_id, unique_key)
        ) WITH CLUSTERING ORDER BY (at ASC, ordering_id ASC, unique_key ASC)""",
        # which buckets of a partition may hold rows, so loading skips empty minutes
        f"""CREATE TABLE IF NOT EXISTS {ks}.schedule_buckets (
            partition int,
            bucket bigint,
            PRIMARY KEY (partition, bucket)
        ) WITH CLUSTERING ORDER BY (bucket ASC)""",
        # one row per task key: what users query. The shard and slot follow from the key
        # (see status_layout); released_at, started_at, finished_at: when a finished task was
        # first released, and when its last attempt started and ended on the worker.
        f"""CREATE TABLE IF NOT EXISTS {ks}.key_status (
            shard int,
            slot bigint,
            at timestamp,
            ordering_id text,
            unique_key text,
            state text,
            task text,
            partition int,
            bucket bigint,
            attempts int,
            last_error text,
            outcome text,
            outcome_attempt int,
            outcome_generation bigint,
            updated_at timestamp,
            envelope blob,
            released_at timestamp,
            started_at timestamp,
            finished_at timestamp,
            PRIMARY KEY ((shard, slot), at, ordering_id, unique_key)
        ) WITH CLUSTERING ORDER BY (at ASC, ordering_id ASC, unique_key ASC)""",
        # added after the table's first version: which release of its attempt an outcome
        # came from (see celery_scheduler.heartbeat)
        f"ALTER TABLE {ks}.key_status ADD IF NOT EXISTS outcome_generation bigint",
        # the shard count and slot width of key_status, written once by init
        f"""CREATE TABLE IF NOT EXISTS {ks}.status_layout (
            id int PRIMARY KEY,
            shards int,
            slot_seconds int
        )""",
        # who may release a partition: written only with lightweight transactions. The ring
        # is always 0: every lease shares one Cassandra partition (see LEASES_TABLE).
        f"""CREATE TABLE IF NOT EXISTS {ks}.{LEASES_TABLE} (
            ring int,
            partition int,
            owner text,
            epoch bigint,
            expires_at timestamp,
            PRIMARY KEY (ring, partition)
        )""",
        # the latest occurrence each periodic entry fired, by the partition firing it
        f"""CREATE TABLE IF NOT EXISTS {ks}.{FIRED_TABLE} (
            partition int,
            entry text,
            occurrence timestamp,
            PRIMARY KEY (partition, entry)
        )""",
        # periodic entries changed at run time; the ring is always 0 (see CHANGES_TABLE)
        f"""CREATE TABLE IF NOT EXISTS {ks}.{CHANGES_TABLE} (
            ring int,
            entry text,
            paused boolean,
            deleted boolean,
            definition text,
            resumed_at timestamp,
            updated_at timestamp,
            PRIMARY KEY (ring, entry)
        )""",
        # the operators' log, a partition a month (see store/cassandra_audit.py)
        f"""CREATE TABLE IF NOT EXISTS {ks}.{OPERATOR_LOG_TABLE} (
            month int,
            at timestamp,
            id timeuuid,
            actor text,
            action text,
            target text,
            detail text,
            PRIMARY KEY (month, at, id)
        ) WITH CLUSTERING ORDER BY (at DESC, id DESC)""",
        # the operators' pauses; the ring is always 0 (see PAUSES_TABLE)
        f"""CREATE TABLE IF NOT EXISTS {ks}.{PAUSES_TABLE} (
            ring int,
            scope text,
            value text,
            paused_at timestamp,
            paused_by text,
            reason text,
            PRIMARY KEY (ring, scope, value)
        )""",
        # the time a task that carries its own task id was last scheduled at (TASK_NAMES_TABLE)
        f"""CREATE TABLE IF NOT EXISTS {ks}.{TASK_NAMES_TABLE} (
            ordering_id text,
            unique_key text,
            at timestamp,
            PRIMARY KEY ((ordering_id, unique_key))
        )""",
        # the operators' rate limits; the ring is always 0 (see RATE_LIMITS_TABLE)
        f"""CREATE TABLE IF NOT EXISTS {ks}.{RATE_LIMITS_TABLE} (
            ring int,
            scope text,
            value text,
            per_second double,
            set_at timestamp,
            set_by text,
            PRIMARY KEY (ring, scope, value)
        )""",
        # the leases of earlier versions, each retired by the first dispatcher of this
        # version that leases its partition (see OLD_LEASE_TABLE)
        f"""CREATE TABLE IF NOT EXISTS {ks}.{OLD_LEASE_TABLE} (
            partition int PRIMARY KEY,
            owner text,
            epoch bigint,
            expires_at timestamp
        )""",
    ]
