"""Readiness probes for the local services: exit 0 when the service really answers.

Usage: python scripts/probe.py kafka|cassandra|cassandra-ring|redis|rabbitmq|postgres [host:port]

Each probe does what a client would do first: a Kafka metadata request, a CQL query
against ``system.local``, a Redis PING, an AMQP connection, a PostgreSQL query. It prints
one line saying what answered. ``cassandra-ring`` takes host:port,... (the nodes of
scripts/cassandra-cluster meant to run) and checks that the nodes see each other up.
"""

from __future__ import annotations

import socket
import struct
import sys

DEFAULTS = {"kafka": "127.0.0.1:9092", "cassandra": "127.0.0.1:9042", "redis": "127.0.0.1:6379",
            "rabbitmq": "127.0.0.1:5672", "postgres": "127.0.0.1:5432",
            "cassandra-ring": "127.0.0.2:29042,127.0.0.3:29042,127.0.0.4:29042"}


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


def probe_cassandra_ring(addresses: str) -> str:
    """Every node of *addresses* answers CQL and sees each of them NORMAL in gossip, at the
    generation that node started with (so a restarted node is known as restarted, not as
    the one that died); a node that knows of no other node reads at ALL, which needs every
    replica to be up in its own view."""
    import logging

    from cassandra import ConsistencyLevel
    from cassandra.cluster import Cluster
    from cassandra.query import SimpleStatement

    logging.getLogger("cassandra").setLevel(logging.CRITICAL)
    wanted = [address.rsplit(":", 1)[0] for address in addresses.split(",")]
    port = int(addresses.split(",")[0].rsplit(":", 1)[1])  # the same on every node's address
    cluster = Cluster(wanted, port=port, connect_timeout=3, protocol_version=5)
    try:
        session = cluster.connect()
        hosts = {host.address: host for host in cluster.metadata.all_hosts()}
        views = {}
        for node in wanted:
            if node not in hosts:
                raise RuntimeError(f"{node} is not in the ring")
            rows = session.execute("SELECT address, generation, status_with_port"
                                   " FROM system_views.gossip_info", timeout=5, host=hosts[node])
            views[node] = {row.address: row for row in rows}
        for node, view in views.items():
            for other in wanted:
                row = view.get(other)
                if (row is None or not (row.status_with_port or "").startswith("NORMAL")
                        or row.generation != views[other][other].generation):
                    raise RuntimeError(f"{node} does not see {other} up yet "
                                       f"({row.status_with_port if row is not None else 'unknown'})")
        # ALL needs as many nodes as system_distributed has replicas (3): a smaller ring
        # has too few, a node that knows of one not in *addresses* has it down
        replication = session.execute("SELECT replication FROM system_schema.keyspaces"
                                      " WHERE keyspace_name = 'system_distributed'").one().replication
        everyone = SimpleStatement("SELECT keyspace_name FROM system_distributed.view_build_status"
                                   " LIMIT 1", consistency_level=ConsistencyLevel.ALL)
        for node, view in views.items():
            if set(view) <= set(wanted) and len(view) >= int(replication["replication_factor"]):
                session.execute(everyone, timeout=5, host=hosts[node])
        return f"cassandra ring {addresses}: {len(wanted)} node(s), each seeing the others up"
    finally:
        cluster.shutdown()


def probe_redis(address: str) -> str:
    import redis

    host, port = address.rsplit(":", 1)
    client = redis.Redis(host=host, port=int(port), socket_timeout=3, socket_connect_timeout=3)
    client.ping()
    return f"redis {address}: PONG, version {client.info('server')['redis_version']}"


def probe_rabbitmq(address: str) -> str:
    import amqp

    connection = amqp.Connection(address, connect_timeout=3)
    connection.connect()
    try:
        version = connection.server_properties.get("version", b"?")
        return f"rabbitmq {address}: AMQP open, version {version!s}"
    finally:
        connection.close()


def _pg_messages(sock: socket.socket) -> dict[bytes, list[bytes]]:
    """Backend messages by type until ReadyForQuery ("Z"); an ErrorResponse raises, and so does
    a request for a password (the server then waits for it)."""
    seen: dict[bytes, list[bytes]] = {}
    buffer = b""
    while True:
        while len(buffer) < 5 or len(buffer) < 1 + struct.unpack("!I", buffer[1:5])[0]:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("the server closed the connection")
            buffer += chunk
        size = struct.unpack("!I", buffer[1:5])[0]
        kind, body, buffer = buffer[:1], buffer[5:1 + size], buffer[1 + size:]
        if kind == b"E":  # fields: a type byte, then text, NUL-terminated; "M" is the message
            fields = {f[:1]: f[1:].decode(errors="replace") for f in body.split(b"\0") if f}
            raise RuntimeError(fields.get(b"M", "error"))
        if kind == b"R" and body[:4] != struct.pack("!I", 0):
            raise RuntimeError("the server asks for a password; the local cluster should trust loopback")
        seen.setdefault(kind, []).append(body)
        if kind == b"Z":
            return seen


def probe_postgres(address: str) -> str:
    # The wire protocol by hand (startup as "postgres", one simple query), so the probe needs
    # no driver: the services' own probe environment has none.
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=3) as sock:
        params = b"user\0postgres\0database\0postgres\0\0"
        sock.sendall(struct.pack("!II", 8 + len(params), 196608) + params)  # protocol 3.0
        _pg_messages(sock)
        sql = b"SELECT version()\0"
        sock.sendall(b"Q" + struct.pack("!I", 4 + len(sql)) + sql)
        row = _pg_messages(sock)[b"D"][0]  # DataRow: column count, then length and text
        version = row[6:6 + struct.unpack("!i", row[2:6])[0]].decode()
        sock.sendall(b"X" + struct.pack("!I", 4))  # Terminate
    return f"postgres {address}: {' '.join(version.split()[:2])}"


PROBES = {"kafka": probe_kafka, "cassandra": probe_cassandra, "redis": probe_redis,
          "rabbitmq": probe_rabbitmq, "postgres": probe_postgres,
          "cassandra-ring": probe_cassandra_ring}


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
