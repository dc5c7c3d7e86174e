"""The periodic entries' state on Cassandra.

What each entry fired last: a row per entry in ``periodic_fired``, in the Cassandra partition
of the Kafka partition that fires it, so the dispatcher taking that partition reads its
entries with one request; written by the partition's owner only, fenced like its other
writes (see ``store/fencing.py``).

Entries changed at run time: a row per entry in ``periodic_changes``, all in one Cassandra
partition (there are few), which every dispatcher that fires entries reads every few
seconds; written by operators (the CLI, the HTTP API, Python), not fenced.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from celery_scheduler.store.cql import to_ms, to_timestamp
from celery_scheduler.store.records import EntryChange
from celery_scheduler.store.schema import CHANGES_TABLE, FIRED_TABLE

if TYPE_CHECKING:
    from celery_scheduler.store.cqlsession import CqlSession

__all__ = ["PeriodicEntries"]

RING = 0
_READ_FIRED = f"SELECT entry, occurrence FROM {{ks}}.{FIRED_TABLE} WHERE partition = ?"
_WRITE_FIRED = f"INSERT INTO {{ks}}.{FIRED_TABLE} (partition, entry, occurrence) VALUES (?, ?, ?)"
_READ_CHANGES = (f"SELECT entry, paused, deleted, definition, resumed_at, updated_at"
                 f" FROM {{ks}}.{CHANGES_TABLE} WHERE ring = ?")
_WRITE_CHANGE = (f"INSERT INTO {{ks}}.{CHANGES_TABLE} (ring, entry, paused, deleted, definition,"
                 f" resumed_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)")
_FORGET_CHANGE = f"DELETE FROM {{ks}}.{CHANGES_TABLE} WHERE ring = ? AND entry = ?"


class PeriodicEntries:
    """The :class:`~celery_scheduler.store.base.PeriodicLog` calls of the Cassandra store (a mixin)."""

    _cql: CqlSession

    def last_fired(self, partition: int) -> dict[str, int]:
        rows = self._cql.execute(f"read what the periodic entries of partition {partition} fired",
                                 _READ_FIRED, (partition,))
        return {row.entry: to_ms(row.occurrence) for row in rows}

    def note_fired(self, partition: int, fired: Mapping[str, int]) -> None:
        if fired:
            self._cql.batch(f"note what the periodic entries of partition {partition} fired",
                            partition, [(_WRITE_FIRED, (partition, name, to_timestamp(at)))
                                        for name, at in fired.items()])

    def entry_changes(self) -> dict[str, EntryChange]:
        rows = self._cql.execute("read the periodic entries changed at run time", _READ_CHANGES,
                                 (RING,))
        return {row.entry: EntryChange(row.entry, bool(row.paused), bool(row.deleted),
                                       row.definition,
                                       to_ms(row.resumed_at) if row.resumed_at else 0,
                                       to_ms(row.updated_at) if row.updated_at else 0)
                for row in rows}

    def change_entry(self, change: EntryChange) -> None:
        self._cql.execute(f"change periodic entry {change.name!r}", _WRITE_CHANGE, (
            RING, change.name, change.paused, change.deleted, change.definition,
            to_timestamp(change.resumed_ms) if change.resumed_ms else None,
            to_timestamp(change.updated_ms)))

    def forget_entry_change(self, name: str) -> None:
        self._cql.execute(f"reset periodic entry {name!r}", _FORGET_CHANGE, (RING, name))
