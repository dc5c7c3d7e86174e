"""What each system keeps on disk and where, read from the running services at the start of a run.

A scheduler that fsyncs every write pays for it in every row of the report, one that keeps
tasks in memory does not: the report says which system ran with which durability, so that
no row compares a durable path with a volatile one unawares. Each setting is read from the
service itself (its configuration as it runs), not assumed; a service that cannot be asked
says so.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["cassandra", "describe", "kafka", "postgres", "rabbitmq", "redis_broker"]


def _asked(what: str, ask: Callable[[], str]) -> str:
    try:
        return ask()
    except Exception as exc:  # a service the run does not use may be down: say so, go on
        return f"not read ({what}: {type(exc).__name__}: {str(exc)[:120]})"


def kafka(bootstrap: str, replication: int) -> str:
    from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    brokers = admin.list_topics(timeout=10).brokers
    resource = ConfigResource("broker", str(min(brokers)))
    configs = admin.describe_configs([resource])[resource].result(10)

    def value(name: str) -> str:
        entry = configs.get(name)
        return "unset" if entry is None or entry.value is None else str(entry.value)

    flush = value("log.flush.interval.messages")
    flushed = ("log flushed by the OS (Kafka's default)" if flush in ("unset", str(2**63 - 1))
               else f"log flushed every {flush} messages")
    return (f"{len(brokers)} broker(s), the scheduler's topics at replication factor {replication}, "
            f"min.insync.replicas {value('min.insync.replicas')}, producers acks=all with "
            f"idempotence, {flushed}")


def cassandra(host: str, port: int, replication: str, consistency: str, serial: str) -> str:
    from cassandra.cluster import Cluster

    cluster = Cluster([host], port=port)
    try:
        session = cluster.connect()
        settings = {row.name: row.value for row in session.execute(
            "SELECT name, value FROM system_views.settings")}
        nodes = len(cluster.metadata.all_hosts())
    finally:
        cluster.shutdown()
    mode = settings.get("commitlog_sync", "unknown")
    if mode == "periodic":
        period = settings.get("commitlog_sync_period") or settings.get("commitlog_sync_period_in_ms")
        mode = f"periodic (every {period}: an acknowledged write may be lost by a power cut)"
    elif mode == "batch":
        mode = "batch (a write is acknowledged once synced)"
    elif mode == "group":
        mode = f"group (synced in windows of {settings.get('commitlog_sync_group_window')})"
    return (f"{nodes} node(s), keyspaces made with replication {replication}, writes at "
            f"{consistency}, lightweight transactions at {serial}, commitlog_sync {mode}")


def redis_broker(url: str) -> str:
    import redis

    client = redis.Redis.from_url(url)
    try:
        appendonly = client.config_get("appendonly").get("appendonly")
        fsync = client.config_get("appendfsync").get("appendfsync")
        save = client.config_get("save").get("save") or "none"
    finally:
        client.close()
    kept = (f"appendonly yes, appendfsync {fsync}" if appendonly == "yes"
            else "appendonly no: a restart loses what it held")
    return f"{kept}; snapshots (save): {save}"


def postgres(conninfo: str) -> str:
    import psycopg

    rows: dict[str, str] = {}
    with psycopg.connect(conninfo, connect_timeout=5) as connection:
        for name in ("fsync", "synchronous_commit", "wal_level"):
            row = connection.execute(f"SHOW {name}").fetchone()
            rows[name] = str(row[0]) if row else "unknown"
    return (f"fsync {rows['fsync']}, synchronous_commit {rows['synchronous_commit']} (a commit "
            f"waits for its WAL flush when on), wal_level {rows['wal_level']}")


def rabbitmq() -> str:
    # Celery's own defaults, which every system here keeps: durable queues, persistent messages
    return ("durable queues and persistent messages (Celery's defaults); celery_scheduler's "
            "releases wait for publisher confirms, Celery's own publishes do not by default")


def describe(*, kafka_bootstrap: str, replication: int, cassandra_host: str, cassandra_port: int,
             cassandra_replication: str, consistency: str, serial: str, redis_url: str,
             postgres_conninfo: str) -> dict[str, str]:
    """Each service's durability as it runs, service → text."""
    return {
        "Kafka": _asked("Kafka", lambda: kafka(kafka_bootstrap, replication)),
        "Cassandra": _asked("Cassandra", lambda: cassandra(
            cassandra_host, cassandra_port, cassandra_replication, consistency, serial)),
        "Redis (Celery broker, RQ)": _asked("Redis", lambda: redis_broker(redis_url)),
        "RabbitMQ (Celery broker)": rabbitmq(),
        "PostgreSQL (procrastinate)": _asked("PostgreSQL", lambda: postgres(postgres_conninfo)),
    }
