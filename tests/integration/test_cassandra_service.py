"""The local Cassandra node stores rows and runs lightweight transactions."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cassandra.cluster import Cluster, Session

pytestmark = pytest.mark.cassandra


@pytest.fixture
def session(cassandra_contact: str, unique_name: str) -> Iterator[Session]:
    host, port = cassandra_contact.rsplit(":", 1)
    cluster = Cluster([host], port=int(port), protocol_version=5)
    session = cluster.connect()
    session.execute(
        f"CREATE KEYSPACE {unique_name} WITH replication = "
        "{'class': 'SimpleStrategy', 'replication_factor': 1}"
    )
    session.set_keyspace(unique_name)
    yield session
    session.execute(f"DROP KEYSPACE {unique_name}")
    cluster.shutdown()


def test_row_round_trip_and_lightweight_transaction(session: Session) -> None:
    session.execute("CREATE TABLE items (id text PRIMARY KEY, value int)")

    session.execute("INSERT INTO items (id, value) VALUES (%s, %s)", ("a", 1))
    assert session.execute("SELECT value FROM items WHERE id = %s", ("a",)).one().value == 1

    # a lightweight transaction applies once and then reports the existing row
    first = session.execute("INSERT INTO items (id, value) VALUES (%s, %s) IF NOT EXISTS", ("b", 2))
    second = session.execute("INSERT INTO items (id, value) VALUES (%s, %s) IF NOT EXISTS", ("b", 3))
    assert first.was_applied is True
    assert second.was_applied is False
    assert session.execute("SELECT value FROM items WHERE id = %s", ("b",)).one().value == 2
