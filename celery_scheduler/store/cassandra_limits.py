"""The operators' rate limits on Cassandra.

A row per limit in ``rate_limits``, all in one Cassandra partition (there are few), which
every dispatcher reads every few seconds (see :mod:`celery_scheduler.dispatcher.limits`);
written by operators, not fenced: a limit is not a partition's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from celery_scheduler.store.cql import to_ms, to_timestamp
from celery_scheduler.store.records import PauseScope, RateLimit
from celery_scheduler.store.schema import RATE_LIMITS_TABLE

if TYPE_CHECKING:
    from celery_scheduler.store.cqlsession import CqlSession

__all__ = ["RateLimits"]

RING = 0
_READ = f"SELECT scope, value, per_second, set_at, set_by FROM {{ks}}.{RATE_LIMITS_TABLE} WHERE ring = ?"
_WRITE = (f"INSERT INTO {{ks}}.{RATE_LIMITS_TABLE} (ring, scope, value, per_second, set_at, set_by)"
          f" VALUES (?, ?, ?, ?, ?, ?)")
_DROP = f"DELETE FROM {{ks}}.{RATE_LIMITS_TABLE} WHERE ring = ? AND scope = ? AND value = ?"


class RateLimits:
    """The :class:`~celery_scheduler.store.base.RateLimitTable` calls of the Cassandra store
    (a mixin)."""

    _cql: CqlSession

    def rate_limits(self) -> list[RateLimit]:
        rows = self._cql.execute("read the rate limits", _READ, (RING,))
        return [RateLimit(PauseScope(row.scope), row.value, float(row.per_second),
                          to_ms(row.set_at), row.set_by or "")
                for row in rows if row.scope in PauseScope._value2member_map_ and row.per_second]

    def put_rate_limit(self, limit: RateLimit) -> None:
        self._cql.execute(f"limit {limit.label}", _WRITE, (
            RING, limit.scope.value, limit.value, float(limit.per_second),
            to_timestamp(limit.set_ms), limit.by))

    def drop_rate_limit(self, scope: PauseScope, value: str) -> None:
        self._cql.execute(f"lift the rate limit of {scope.value} {value!r}", _DROP,
                          (RING, scope.value, value))
