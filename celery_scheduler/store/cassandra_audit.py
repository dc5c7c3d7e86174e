"""The operators' log on Cassandra.

A row per action in ``operator_log``, in one Cassandra partition per month (the month of
its time, ``YYYYMM``), newest first; each row expires after ``OPERATOR_LOG_DAYS``. Reading
the last actions walks back from this month, a month at a time, until it has enough or has
read as far back as rows are kept.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import TYPE_CHECKING

from celery_scheduler.store.cql import to_ms, to_timestamp
from celery_scheduler.store.records import OperatorAction
from celery_scheduler.store.schema import OPERATOR_LOG_DAYS, OPERATOR_LOG_TABLE

if TYPE_CHECKING:
    from celery_scheduler.store.cqlsession import CqlSession

__all__ = ["Audit", "month_of"]

_WRITE = (f"INSERT INTO {{ks}}.{OPERATOR_LOG_TABLE} (month, at, id, actor, action, target, detail)"
          f" VALUES (?, ?, ?, ?, ?, ?, ?) USING TTL {OPERATOR_LOG_DAYS * 24 * 3600}")
_READ = (f"SELECT at, actor, action, target, detail FROM {{ks}}.{OPERATOR_LOG_TABLE}"
         f" WHERE month = ? LIMIT ?")


def month_of(at_ms: int) -> int:
    when = dt.datetime.fromtimestamp(at_ms / 1000, dt.timezone.utc)
    return when.year * 100 + when.month


def _months_back(now_ms: int) -> list[int]:
    """This month and those before it, as far back as rows are kept."""
    months = []
    when = dt.datetime.fromtimestamp(now_ms / 1000, dt.timezone.utc).replace(day=1)
    oldest = dt.datetime.fromtimestamp(now_ms / 1000, dt.timezone.utc) - dt.timedelta(days=OPERATOR_LOG_DAYS)
    while when >= oldest.replace(day=1):
        months.append(when.year * 100 + when.month)
        when = (when - dt.timedelta(days=1)).replace(day=1)
    return months


class Audit:
    """The :class:`~celery_scheduler.store.base.OperatorLog` calls of the Cassandra store (a mixin)."""

    _cql: CqlSession

    def note_action(self, action: OperatorAction) -> None:
        self._cql.execute(f"note {action.action} of {action.target} in the operators' log", _WRITE, (
            month_of(action.at_ms), to_timestamp(action.at_ms), uuid.uuid1(), action.actor,
            action.action, action.target, action.detail))

    def actions(self, limit: int, now_ms: int) -> list[OperatorAction]:
        found: list[OperatorAction] = []
        for month in _months_back(now_ms):
            rows = self._cql.execute("read the operators' log", _READ, (month, limit - len(found)))
            found += [OperatorAction(to_ms(row.at), row.actor, row.action, row.target, row.detail or "")
                      for row in rows]
            if len(found) >= limit:
                break
        return found
