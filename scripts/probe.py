"""Readiness probes for the local services: exit 0 when the service really answers.

Usage: python scripts/probe.py kafka|cassandra|redis [host:port]

Each probe does what a client would do first: a Kafka metadata request, a CQL query
against ``system.local``, a Redis PING. It prints one line saying what answered.
"""

from __future__ import annotations

import sys

DEFAULTS = {"kafka": "127.0.0.1:9092", "cassandra": "127.0.0.1:9042", "redis": "127.0.0.1:6379"}


def probe_kafka(address: str) -> str:
    from confluent_kafka.admin import AdminClient

    # log_level 0 keeps librdkafka from printing a line per failed connection attempt.
    admin = AdminClient({"bootstrap.servers": address, "socket.timeout.ms": 3000, "log_level": 0})
    metadata = admin.list_topics(timeout=3)
    return f"kafka {address}: {len(metadata.brokers)} broker(s), cluster {metadata.cluster_id}"


def probe_cassandra(address: str) -> str:
    import logging

    from cassandra.cluster import Cluster

    logging.getLogger("cassandra").setLevel(logging.CRITICAL)
    host, port = address.rsplit(":", 1)
    cluster = Cluster([host], port=int(port), connect_timeout=3, protocol_version=5)
    try:
        session = cluster.connect()
        row = session.execute("SELECT release_version FROM system.local", timeout=5).one()
        return f"cassandra {address}: release {row.release_version}"
    finally:
        cluster.shutdown()


def probe_redis(address: str) -> str:
    import redis

    host, port = address.rsplit(":", 1)
    client = redis.Redis(host=host, port=int(port), socket_timeout=3, socket_connect_timeout=3)
    client.ping()
    return f"redis {address}: PONG, version {client.info('server')['redis_version']}"


PROBES = {"kafka": probe_kafka, "cassandra": probe_cassandra, "redis": probe_redis}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in PROBES:
        print(f"usage: probe.py {'|'.join(PROBES)} [host:port]", file=sys.stderr)
        return 2
    service = argv[0]
    address = argv[1] if len(argv) > 1 else DEFAULTS[service]
    try:
        print(PROBES[service](address))
    except Exception as exc:  # a probe reports any failure as "not ready"
        print(f"{service} {address}: not ready ({type(exc).__name__}: {exc})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
