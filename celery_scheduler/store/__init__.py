"""The schedule store: pending tasks in time buckets, and the status of every task key.

:class:`~celery_scheduler.store.base.ScheduleStore` is the interface (split by who uses it,
see :mod:`~celery_scheduler.store.base`); ``cassandra`` is the real implementation and
``memory`` the in-process one for unit tests and the testing helper. What each transition
of a key writes is decided once, for both, in :mod:`~celery_scheduler.store.lifecycle`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from celery_scheduler.store.base import ScheduleStore, State, StoredTask, TaskStatus

if TYPE_CHECKING:
    from celery_scheduler.config import Settings

__all__ = ["ScheduleStore", "State", "StoredTask", "TaskStatus", "open_store"]


def open_store(settings: Settings) -> ScheduleStore:
    """Connect to the Cassandra schedule store that *settings* describe."""
    from celery_scheduler.store.cassandra import CassandraScheduleStore

    s = settings
    return CassandraScheduleStore(
        s.cassandra_contact_points, s.cassandra_keyspace, port=s.cassandra_port,
        replication=dict(s.cassandra_replication), consistency=s.cassandra_consistency,
        serial_consistency=s.cassandra_serial_consistency,
        bucket_seconds=s.bucket_seconds, status_ttl=s.status_ttl,
        username=s.cassandra_username, password=s.cassandra_password,
        use_ssl=s.cassandra_ssl, request_timeout=s.cassandra_request_timeout,
        status_shards=s.kafka_partitions)

