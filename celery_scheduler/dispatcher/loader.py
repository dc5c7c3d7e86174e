"""Reading a partition's schedule forward in bounded windows (the throughput controller).

Each owned partition has a cursor: the position (bucket, time, ordering id, uniqueness key)
up to which its rows have been loaded. A fill reads pages forward from the cursor, through
the bucket index, until the partition has ``max_loaded`` tasks in memory or the cursor
reaches the look-ahead horizon. Memory therefore stays bounded whatever lies further ahead,
and a backlog after downtime drains oldest first, a page at a time.
"""

from __future__ import annotations

import logging

from celery_scheduler.dispatcher.timetable import Loaded, Timetable
from celery_scheduler.store.base import Cursor, ScheduleStore, StoredTask, bucket_of, droppable

__all__ = ["PartitionLoader", "loaded_from"]

logger = logging.getLogger(__name__)


def loaded_from(row: StoredTask) -> Loaded:
    return Loaded(row.partition, row.envelope, attempts=row.attempts,
                  not_before_ms=row.not_before_ms, lease_until_ms=row.lease_until_ms,
                  blocked=row.blocked, bucket=row.bucket)


class PartitionLoader:
    """The cursor of one partition, and the reads that advance it."""

    def __init__(self, store: ScheduleStore, partition: int, *, page_size: int = 500,
                 max_loaded: int = 5000, lookahead_ms: int = 60_000) -> None:
        self.store = store
        self.partition = partition
        self.page_size = page_size
        self.max_loaded = max_loaded
        self.lookahead_ms = lookahead_ms
        self.cursor: Cursor | None = None  # None: not started; find the first indexed bucket
        self.inclusive = False
        # Reading is needed only when something may have changed: rows written ahead of the
        # cursor (ingest says so), room freed in memory, or the horizon moving on. A slow
        # periodic read covers anything else.
        self.dirty = True
        self.full = False  # the last fill stopped for lack of room, not at the horizon
        self.last_fill_ms = 0
        self.refresh_ms = 1000

    def due_for_fill(self, now_ms: int) -> bool:
        return self.dirty or now_ms - self.last_fill_ms >= self.refresh_ms

    def room_freed(self) -> None:
        """A task of this partition left memory: read on if the last fill ran out of room.

        A fill that reached the horizon has nothing more to read until the horizon moves
        (the periodic fill) or ingest writes ahead of the cursor (which marks it dirty).
        """
        if self.full:
            self.dirty = True

    def passed(self, position: Cursor) -> bool:
        """Whether the cursor is at or beyond *position* (a row there will not be read again)."""
        if self.cursor is None:
            return False
        return position < self.cursor or (position == self.cursor and not self.inclusive)

    def rewind(self, position: Cursor) -> None:
        """Read again from *position* (inclusive): used when a row behind the cursor did not fit."""
        if self.cursor is None:
            return
        if position < self.cursor or (position == self.cursor and not self.inclusive):
            self.cursor, self.inclusive = position, True

    def fill(self, timetable: Timetable, now_ms: int) -> int:
        """Load rows up to the horizon while there is room; return how many were added."""
        horizon = bucket_of(now_ms + self.lookahead_ms, self.store.bucket_seconds)
        added = 0
        self.dirty, self.last_fill_ms = False, now_ms
        if self.cursor is None:
            first = self.store.buckets(self.partition, 0, horizon, limit=1)
            if not first:
                return 0
            self.cursor, self.inclusive = Cursor(first[0]), False
        while timetable.count(self.partition) < self.max_loaded:
            room = self.max_loaded - timetable.count(self.partition)
            rows = self.store.read(self.partition, self.cursor, min(self.page_size, room),
                                   self.inclusive)
            for row in rows:
                if row.key not in timetable and timetable.add(loaded_from(row)):
                    added += 1
            if rows:
                self.cursor, self.inclusive = rows[-1].position, False
                if len(rows) == min(self.page_size, room):
                    continue  # maybe more in this bucket
            if not self._next_bucket(horizon, now_ms, emptied=not rows):
                break
        self.full = timetable.count(self.partition) >= self.max_loaded
        return added

    def _next_bucket(self, horizon: int, now_ms: int, emptied: bool) -> bool:
        assert self.cursor is not None
        current = self.cursor.bucket
        following = self.store.buckets(self.partition, current + 1, horizon, limit=1)
        if not following:
            return False
        if emptied and self.cursor.at_ms < 0 and droppable(current, now_ms, self.store.bucket_seconds):
            # read from its start and found nothing, and no writer uses it any more
            self.store.drop_bucket(self.partition, current)
        self.cursor, self.inclusive = Cursor(following[0]), False
        return True
