"""Bring a keyspace made by an earlier version to this one's layout (run by ``scheduler init``).

Earlier versions kept statuses in ``task_status``, one Cassandra partition a key. Its rows
are copied into ``key_status`` with what is left of their time to live, then the old table
is dropped. The copy is idempotent: an ``init`` stopped half-way copies again from the
start, and the old table goes only once every row was written. Dispatchers must be stopped
meanwhile (a dispatcher refuses to start while the old table is there).
"""

from __future__ import annotations

import logging
from typing import Any

from cassandra.concurrent import execute_concurrent_with_args

from celery_scheduler.keys import TaskKey
from celery_scheduler.store.cql import to_ms, translate_errors
from celery_scheduler.store.schema import OLD_STATUS_TABLE, STATUS_COLUMNS
from celery_scheduler.store.status_layout import StatusLayout

__all__ = ["move_old_statuses"]

logger = logging.getLogger(__name__)

PAGE = 1000


def move_old_statuses(session: Any, ks: str, layout: StatusLayout) -> int:
    """Copy every row of keyspace *ks*'s old status table into ``key_status``, drop it;
    return the count."""
    old = session.cluster.metadata.keyspaces[ks].tables[OLD_STATUS_TABLE]
    columns = [name for name in STATUS_COLUMNS if name in old.columns]
    names = ", ".join(columns)
    insert = session.prepare(
        f"INSERT INTO {ks}.key_status (shard, slot, at, ordering_id, unique_key, {names})"
        f" VALUES (?, ?, ?, ?, ?, {', '.join('?' * len(columns))}) USING TTL ?")
    query = session.prepare(f"SELECT ordering_id, at, unique_key, {names}, TTL(updated_at) AS ttl"
                            f" FROM {ks}.{OLD_STATUS_TABLE}")
    query.fetch_size = PAGE
    logger.warning("moving the task statuses of %s.%s to %s.key_status", ks, OLD_STATUS_TABLE, ks)
    moved = 0
    with translate_errors(f"move the statuses of {OLD_STATUS_TABLE} to key_status"):
        rows = session.execute(query, timeout=60)
        page: list[tuple[Any, ...]] = []
        for row in rows:
            key = TaskKey(row.ordering_id, to_ms(row.at), row.unique_key)
            page.append((*layout.primary_key(key), *(getattr(row, name) for name in columns),
                         row.ttl or 0))
            if len(page) == PAGE:
                moved += _write(session, insert, page)
                page = []
                logger.warning("moved %d statuses so far", moved)
        moved += _write(session, insert, page)
        session.execute(f"DROP TABLE {ks}.{OLD_STATUS_TABLE}", timeout=120)
    logger.warning("moved %d task statuses to %s.key_status and dropped %s.%s", moved, ks, ks,
                   OLD_STATUS_TABLE)
    return moved


def _write(session: Any, insert: Any, page: list[tuple[Any, ...]]) -> int:
    if page:
        execute_concurrent_with_args(session, insert, page, concurrency=64,
                                     raise_on_first_error=True)
    return len(page)
