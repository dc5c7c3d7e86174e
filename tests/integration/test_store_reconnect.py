"""After a Cassandra outage the store is usable again within seconds, not minutes.

cassandra-driver retries a node marked down on a schedule that grows to ten minutes; the
chaos run saw dispatchers idle for a minute after Cassandra was back.
"""

from __future__ import annotations

import itertools

import pytest

from celery_scheduler.store.cassandra import CassandraScheduleStore

pytestmark = pytest.mark.cassandra


def test_a_node_marked_down_is_retried_every_few_seconds(cassandra_contact: str) -> None:
    host, port = cassandra_contact.rsplit(":", 1)
    store = CassandraScheduleStore([host], "system", port=int(port))
    try:
        delays = list(itertools.islice(store._cluster.reconnection_policy.new_schedule(), 50))
    finally:
        store.close()
    assert len(delays) == 50  # it never gives up
    assert max(delays) <= 5.0
