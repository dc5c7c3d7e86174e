"""The operators' pauses on Cassandra.

A row per pause in ``pauses``, all in one Cassandra partition (there are few), which every
dispatcher reads every few seconds (see :mod:`celery_scheduler.dispatcher.pausing`); written
by operators (the CLI, the HTTP API, Python), not fenced: a pause is not a partition's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from celery_scheduler.store.cql import to_ms, to_timestamp
from celery_scheduler.store.records import Pause, PauseScope
from celery_scheduler.store.schema import PAUSES_TABLE

if TYPE_CHECKING:
    from celery_scheduler.store.cqlsession import CqlSession

__all__ = ["Pauses"]

RING = 0
_READ = f"SELECT scope, value, paused_at, paused_by, reason FROM {{ks}}.{PAUSES_TABLE} WHERE ring = ?"
_WRITE = (f"INSERT INTO {{ks}}.{PAUSES_TABLE} (ring, scope, value, paused_at, paused_by, reason)"
          f" VALUES (?, ?, ?, ?, ?, ?)")
_DROP = f"DELETE FROM {{ks}}.{PAUSES_TABLE} WHERE ring = ? AND scope = ? AND value = ?"


class Pauses:
    """The :class:`~celery_scheduler.store.base.PauseTable` calls of the Cassandra store (a mixin)."""

    _cql: CqlSession

    def pauses(self) -> list[Pause]:
        rows = self._cql.execute("read the pauses", _READ, (RING,))
        return [Pause(PauseScope(row.scope), row.value, to_ms(row.paused_at), row.paused_by or "",
                      row.reason or "")
                for row in rows if row.scope in PauseScope._value2member_map_]

    def put_pause(self, pause: Pause) -> None:
        self._cql.execute(f"pause {pause.label}", _WRITE, (
            RING, pause.scope.value, pause.value, to_timestamp(pause.paused_ms), pause.by,
            pause.reason))

    def drop_pause(self, scope: PauseScope, value: str) -> None:
        self._cql.execute(f"resume {scope.value} {value!r}", _DROP, (RING, scope.value, value))
