"""Partition leases on Cassandra: every change a lightweight transaction on ``leases``, so
two dispatchers can never both hold a partition's newest epoch (see ``docs/design.md``,
rebalance and fencing).

Every lease is a row of one Cassandra partition (``ring`` 0), so a dispatcher renews all of
its leases with one conditional batch, a single Paxos round, instead of one a partition:
on an idle deployment those renewals were most of Cassandra's work. Taking partitions is
one quorum read of the ring and one conditional batch.

Earlier versions kept a lease per Cassandra partition, in ``partition_lease``. Before its
first lease of a partition, a dispatcher of this version retires that partition's old row:
it takes it, expired or free, for an owner that never renews and never expires, so that a
dispatcher of the earlier version still running during an upgrade can no longer take it;
while one of them holds it, the partition is not leased here either.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from celery_scheduler.errors import StoreUnavailableError
from celery_scheduler.store.base import Lease
from celery_scheduler.store.cql import Statements, to_ms, to_timestamp
from celery_scheduler.store.schema import LEASES_TABLE, OLD_LEASE_TABLE

if TYPE_CHECKING:
    from celery_scheduler.store.cqlsession import CqlSession

__all__ = ["RETIRED_OWNER", "PartitionLeases"]

logger = logging.getLogger(__name__)

RING = 0
# The owner of a retired row of the old table, held until the end of time.
RETIRED_OWNER = f"(retired: leased in {LEASES_TABLE})"
_FOREVER = dt.datetime(9999, 12, 31)

_READ_RING = f"SELECT partition, owner, epoch, expires_at FROM {{ks}}.{LEASES_TABLE} WHERE ring = ?"
_INSERT = (f"INSERT INTO {{ks}}.{LEASES_TABLE} (ring, partition, owner, epoch, expires_at)"
           " VALUES (?, ?, ?, 1, ?) IF NOT EXISTS")
_TAKE = (f"UPDATE {{ks}}.{LEASES_TABLE} SET owner = ?, epoch = ?, expires_at = ?"
         " WHERE ring = ? AND partition = ? IF epoch = ?")
_EXTEND = (f"UPDATE {{ks}}.{LEASES_TABLE} SET expires_at = ? WHERE ring = ? AND partition = ?"
           " IF owner = ? AND epoch = ?")


class PartitionLeases:
    """The lease calls of :class:`CassandraScheduleStore` (a mixin)."""

    _cql: CqlSession
    # partitions whose row in the old table is retired (see the module's docstring)
    _retired: set[int] | None = None

    def _ring(self) -> dict[int, Any]:
        """Every lease, by partition (a quorum read: the writes' conditions decide)."""
        rows = self._cql.execute("read the partition leases", _READ_RING, (RING,))
        return {row.partition: row for row in rows}

    def acquire_lease(self, partition: int, owner: str, ttl_ms: int, now_ms: int) -> Lease | None:
        return self.acquire_leases([partition], owner, ttl_ms, now_ms).get(partition)

    def acquire_leases(self, partitions: Sequence[int], owner: str, ttl_ms: int, now_ms: int
                       ) -> dict[int, Lease]:
        """Take those of *partitions* that are free, expired or already ours: all of them with
        one conditional batch, or none if another dispatcher changed one meanwhile."""
        free = self._retire_old_leases(partitions, now_ms)
        if not free:
            return {}
        current = self._ring()
        expires = now_ms + ttl_ms
        statements: Statements = []
        taken: dict[int, Lease] = {}
        for partition in free:
            row = current.get(partition)
            if row is None:
                statements.append((_INSERT, (RING, partition, owner, to_timestamp(expires))))
                taken[partition] = Lease(partition, owner, 1, expires)
            elif row.owner == owner or to_ms(row.expires_at) <= now_ms:
                epoch = (row.epoch or 0) + 1
                statements.append((_TAKE, (owner, epoch, to_timestamp(expires), RING, partition,
                                           row.epoch)))
                taken[partition] = Lease(partition, owner, epoch, expires)
        if not statements or not self._cql.conditional_batch(
                f"take partitions {sorted(taken)}", statements):
            return {}
        return taken

    def renew_lease(self, lease: Lease, ttl_ms: int, now_ms: int) -> Lease | None:
        return self.renew_leases([lease], ttl_ms, now_ms)[0]

    def renew_leases(self, leases: Sequence[Lease], ttl_ms: int, now_ms: int) -> list[Lease | None]:
        """Extend *leases* with one conditional batch. If one of them is no longer ours, the
        batch applies nothing: the ring is read and those still ours are renewed again."""
        if not leases:
            return []
        expires = now_ms + ttl_ms
        what = f"renew the leases of partitions {[lease.partition for lease in leases]}"
        if self._extend(what, leases, expires):
            return [replace(lease, expires_ms=expires) for lease in leases]
        current = self._ring()
        ours = [lease for lease in leases
                if (row := current.get(lease.partition)) is not None
                and (row.owner, row.epoch) == (lease.owner, lease.epoch)]
        if len(ours) == len(leases) or (ours and not self._extend(what, ours, expires)):
            # every lease still looked ours, or changed again meanwhile: no answer this time
            raise StoreUnavailableError(f"Cassandra could not {what}: another dispatcher was "
                                        "changing the leases; trying again")
        renewed = {lease.partition: replace(lease, expires_ms=expires) for lease in ours}
        return [renewed.get(lease.partition) for lease in leases]

    def _extend(self, what: str, leases: Sequence[Lease], expires_ms: int) -> bool:
        return self._cql.conditional_batch(what, [
            (_EXTEND, (to_timestamp(expires_ms), RING, lease.partition, lease.owner, lease.epoch))
            for lease in leases])

    def release_lease(self, lease: Lease) -> None:
        self._cql.lwt(f"give up partition {lease.partition}", _EXTEND,
                      (to_timestamp(0), RING, lease.partition, lease.owner, lease.epoch))

    def _retire_old_leases(self, partitions: Sequence[int], now_ms: int) -> list[int]:
        """Those of *partitions* whose row in the old lease table is retired, retiring the
        rows no dispatcher of an earlier version holds (each once: then it is known here)."""
        if self._retired is None:
            self._retired = set()
        retired = self._retired
        todo = [partition for partition in partitions if partition not in retired]
        if todo:
            rows = {row.partition: row for row in self._cql.execute(
                "read the leases of earlier versions",
                f"SELECT partition, owner, epoch, expires_at FROM {{ks}}.{OLD_LEASE_TABLE}", ())}
            for partition in todo:
                row = rows.get(partition)
                if row is not None and row.owner == RETIRED_OWNER:
                    retired.add(partition)
                elif row is None or to_ms(row.expires_at) <= now_ms:
                    if self._retire(partition, row):
                        retired.add(partition)
                else:
                    logger.warning("partition %d is leased by %s, a dispatcher of an earlier "
                                   "version, until %s: it is leased here once that one lets go",
                                   partition, row.owner, row.expires_at)
        return [partition for partition in partitions if partition in retired]

    def _retire(self, partition: int, row: Any) -> bool:
        what = f"retire the old lease of partition {partition}"
        if row is None:
            return bool(self._cql.lwt(what, f"INSERT INTO {{ks}}.{OLD_LEASE_TABLE} (partition, owner,"
                                            " epoch, expires_at) VALUES (?, ?, 1, ?) IF NOT EXISTS",
                                      (partition, RETIRED_OWNER, _FOREVER)).was_applied)
        return bool(self._cql.lwt(what, f"UPDATE {{ks}}.{OLD_LEASE_TABLE} SET owner = ?, epoch = ?,"
                                        " expires_at = ? WHERE partition = ? IF epoch = ?",
                                  (RETIRED_OWNER, (row.epoch or 0) + 1, _FOREVER, partition,
                                   row.epoch)).was_applied)
