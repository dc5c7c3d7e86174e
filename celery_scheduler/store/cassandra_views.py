"""What operators ask the Cassandra store: leases, backlogs, tasks in a state, an ordering
id's rows. Scans and per-bucket counts, fine for a person's question, never on a hot path."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from celery_scheduler.keys import TaskKey
from celery_scheduler.store.base import Lease, State, StoredTask, TaskStatus
from celery_scheduler.store.cql import schedule_envelope, status_of, to_ms

if TYPE_CHECKING:
    from celery_scheduler.store.cqlsession import CqlSession

__all__ = ["OperatorViews"]


class OperatorViews:
    """The read-only operator queries of :class:`CassandraScheduleStore` (a mixin)."""

    _cql: CqlSession

    if TYPE_CHECKING:  # the store's own
        def buckets(self, partition: int, first: int, last: int, limit: int = 100) -> list[int]: ...

        def _ring(self) -> dict[int, Any]: ...

    def leases(self) -> list[Lease]:
        return [Lease(row.partition, row.owner or "", row.epoch or 0, to_ms(row.expires_at))
                for _, row in sorted(self._ring().items())]

    def backlog(self, partition: int) -> tuple[int, int | None]:
        # an operator's query: one count per indexed bucket of the partition
        count, earliest = 0, None
        for bucket in self.buckets(partition, 0, 2**62, limit=1_000_000):
            row = self._cql.execute(f"count bucket {bucket} of partition {partition}",
                                    "SELECT count(*) AS n, min(at) AS first FROM {ks}.schedule"
                                    " WHERE partition = ? AND bucket = ?", (partition, bucket)).one()
            if row is not None and row.n:
                count += row.n
                if row.first is not None:  # an overdue row sits in a later bucket than its time
                    first = to_ms(row.first)
                    earliest = first if earliest is None else min(earliest, first)
        return count, earliest

    def statuses_in_state(self, state: State, limit: int) -> list[TaskStatus]:
        # an operator's query: state is no key of the table, so Cassandra scans it (paged)
        # until it found *limit*
        rows = self._cql.execute(
            f"find {state.value} tasks",
            "SELECT ordering_id, at, unique_key, state, task, partition, bucket, attempts,"
            " last_error, outcome, outcome_attempt, updated_at, released_at, started_at,"
            " finished_at FROM {ks}.key_status"
            " WHERE state = ? LIMIT ? ALLOW FILTERING", (state.value, limit))
        found = []
        for row in rows:
            status = status_of(TaskKey(row.ordering_id, to_ms(row.at), row.unique_key), row)
            if status is not None:
                found.append(status)
        return found

    def bucket_sizes(self, partition: int, first: int, last: int) -> dict[int, int]:
        # an operator's query: one count per indexed bucket in the range
        sizes = {}
        for bucket in self.buckets(partition, first, last, limit=1_000_000):
            row = self._cql.execute(f"count bucket {bucket} of partition {partition}",
                                    "SELECT count(*) AS n FROM {ks}.schedule"
                                    " WHERE partition = ? AND bucket = ?", (partition, bucket)).one()
            if row is not None and row.n:
                sizes[bucket] = int(row.n)
        return sizes

    def rows_of(self, partition: int, ordering_id: str, limit: int = 1000) -> list[StoredTask]:
        # an operator's query: each indexed bucket of the partition, filtered in Cassandra
        found: list[StoredTask] = []
        for bucket in self.buckets(partition, 0, 2**62, limit=1_000_000):
            rows = self._cql.execute(
                f"read the rows of {ordering_id!r} in bucket {bucket} of partition {partition}",
                "SELECT at, unique_key, envelope, attempts, not_before, lease_until, blocked"
                " FROM {ks}.schedule WHERE partition = ? AND bucket = ? AND ordering_id = ?"
                " ALLOW FILTERING", (partition, bucket, ordering_id))
            for row in rows:
                envelope = schedule_envelope(row)
                if envelope is not None:
                    found.append(StoredTask(partition, bucket, envelope, row.attempts or 0,
                                            to_ms(row.not_before), to_ms(row.lease_until),
                                            bool(row.blocked)))
            if len(found) >= limit:
                break
        return sorted(found, key=lambda row: row.position)[:limit]
