"""What each periodic entry fired last, on Cassandra: a row per entry in ``periodic_fired``,
in the Cassandra partition of the Kafka partition that fires it, so the dispatcher taking
that partition reads its entries with one request. Written by the partition's owner only,
fenced like its other writes (see ``store/fencing.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from celery_scheduler.store.cql import to_ms, to_timestamp
from celery_scheduler.store.schema import FIRED_TABLE

if TYPE_CHECKING:
    from celery_scheduler.store.cqlsession import CqlSession

__all__ = ["FiredEntries"]

_READ = f"SELECT entry, occurrence FROM {{ks}}.{FIRED_TABLE} WHERE partition = ?"
_WRITE = f"INSERT INTO {{ks}}.{FIRED_TABLE} (partition, entry, occurrence) VALUES (?, ?, ?)"


class FiredEntries:
    """The :class:`~celery_scheduler.store.base.FiredLog` calls of the Cassandra store (a mixin)."""

    _cql: CqlSession

    def last_fired(self, partition: int) -> dict[str, int]:
        rows = self._cql.execute(f"read what the periodic entries of partition {partition} fired",
                                 _READ, (partition,))
        return {row.entry: to_ms(row.occurrence) for row in rows}

    def note_fired(self, partition: int, fired: Mapping[str, int]) -> None:
        if fired:
            self._cql.batch(f"note what the periodic entries of partition {partition} fired",
                            partition, [(_WRITE, (partition, name, to_timestamp(at)))
                                        for name, at in fired.items()])
