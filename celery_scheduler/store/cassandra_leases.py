"""Partition leases on Cassandra: each change a lightweight transaction on ``partition_lease``,
so two dispatchers can never both hold a partition's newest epoch (see ``docs/design.md``,
rebalance and fencing)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from celery_scheduler.store.base import Lease
from celery_scheduler.store.cql import to_ms, to_timestamp

if TYPE_CHECKING:
    from celery_scheduler.store.cqlsession import CqlSession

__all__ = ["PartitionLeases"]


class PartitionLeases:
    """The lease calls of :class:`CassandraScheduleStore` (a mixin)."""

    _cql: CqlSession

    def acquire_lease(self, partition: int, owner: str, ttl_ms: int, now_ms: int) -> Lease | None:
        current = self._cql.lwt(
            f"read the lease of partition {partition}",
            "SELECT owner, epoch, expires_at FROM {ks}.partition_lease WHERE partition = ?",
            (partition,)).one()
        expires = now_ms + ttl_ms
        if current is None:
            applied = self._cql.lwt(f"take partition {partition}",
                                    "INSERT INTO {ks}.partition_lease (partition, owner, epoch, expires_at)"
                                    " VALUES (?, ?, 1, ?) IF NOT EXISTS",
                                    (partition, owner, to_timestamp(expires))).was_applied
            return Lease(partition, owner, 1, expires) if applied else None
        if current.owner != owner and to_ms(current.expires_at) > now_ms:
            return None
        epoch = (current.epoch or 0) + 1
        applied = self._cql.lwt(f"take partition {partition}",
                                "UPDATE {ks}.partition_lease SET owner = ?, epoch = ?, expires_at = ?"
                                " WHERE partition = ? IF epoch = ?",
                                (owner, epoch, to_timestamp(expires), partition, current.epoch)).was_applied
        return Lease(partition, owner, epoch, expires) if applied else None

    def renew_lease(self, lease: Lease, ttl_ms: int, now_ms: int) -> Lease | None:
        expires = now_ms + ttl_ms
        applied = self._cql.lwt(f"renew the lease of partition {lease.partition}",
                                "UPDATE {ks}.partition_lease SET expires_at = ? WHERE partition = ?"
                                " IF owner = ? AND epoch = ?",
                                (to_timestamp(expires), lease.partition, lease.owner,
                                 lease.epoch)).was_applied
        return Lease(lease.partition, lease.owner, lease.epoch, expires) if applied else None

    def release_lease(self, lease: Lease) -> None:
        self._cql.lwt(f"give up partition {lease.partition}",
                      "UPDATE {ks}.partition_lease SET expires_at = ? WHERE partition = ?"
                      " IF owner = ? AND epoch = ?",
                      (to_timestamp(0), lease.partition, lease.owner, lease.epoch))
