"""Reading a partition's schedule forward in bounded windows (the throughput controller).

Each owned partition has a cursor: the position (bucket, time, ordering id, uniqueness key)
up to which its rows have been loaded. A fill reads pages forward from the cursor, through
the bucket index, until the partition has ``max_loaded`` tasks in memory or the cursor
reaches the look-ahead horizon. Memory therefore stays bounded whatever lies further ahead,
and a backlog after downtime drains oldest first, a page at a time.

Of one ordering id, at most ``MOST_LOADED_PER_ID`` tasks are loaded: it runs one at a time,
so more of it in memory only takes the room of other ordering ids (ten thousand tasks of one
id due at once would fill the partition's memory and leave the others of the partition
unread until most of them had run). A fill passes the rest of such a hot ordering id over,
and remembers where the first one passed over lies; once fewer than half as many are
loaded, a top-up reads on from there, up to the cursor, for that ordering id alone. The
tasks of a hot ordering id in memory therefore always come before any of it left in the
store behind the cursor, and it runs in order.

A fill reads only when something may have changed: every row of an owned partition is
written by this process's ingest loop, which tells the engine about it. A row it writes
behind the cursor, or ahead of it but within what the last fill read up to, goes straight
into memory; a fill is needed when there was no room for one, when the horizon moves into
a new bucket, and, as a safety net for a write no event told of, every
``SAFETY_REFRESH_MS``. An idle dispatcher therefore reads each partition's schedule once in
a while rather than every second, and a busy one does not read back what it just wrote.
"""

from __future__ import annotations

import logging

from celery_scheduler.dispatcher.timetable import Loaded, Timetable
from celery_scheduler.store.base import Cursor, ReleaseLedger, StoredTask, bucket_of, droppable

__all__ = ["PartitionLoader", "loaded_from"]

logger = logging.getLogger(__name__)

# Longest a partition goes without a fill, whatever it was told.
SAFETY_REFRESH_MS = 10_000
# A partition whose last fill ran out of room is read again once it has room for a page
# (or a quarter of what it may hold, if less), or, with less room than that, this long after
# the last fill: a read per page rather than per finished task, and yet an ordering id that
# only a few freed places would let in waits no longer than this.
PARTIAL_REFILL_MS = 1_000
# Tasks of one ordering id loaded at most; a hot one is topped up once it has half as many,
# looked at most every TOP_UP_EVERY_MS.
MOST_LOADED_PER_ID = 256
TOP_UP_EVERY_MS = 1_000


def loaded_from(row: StoredTask) -> Loaded:
    return Loaded(row.partition, row.envelope, attempts=row.attempts,
                  not_before_ms=row.not_before_ms, lease_until_ms=row.lease_until_ms,
                  blocked=row.blocked, bucket=row.bucket)


class PartitionLoader:
    """The cursor of one partition, and the reads that advance it."""

    def __init__(self, store: ReleaseLedger, partition: int, *, page_size: int = 500,
                 max_loaded: int = 5000, lookahead_ms: int = 60_000) -> None:
        self.store = store
        self.partition = partition
        self.page_size = page_size
        self.max_loaded = max_loaded
        self.lookahead_ms = lookahead_ms
        self.cursor: Cursor | None = None  # None: not started; find the first indexed bucket
        self.inclusive = False
        # Reading is needed only when something may have changed (see the module's doc).
        self.dirty = True
        self.full = False  # the last fill stopped for lack of room, not at the horizon
        self.refill_room = max(1, min(page_size, max_loaded // 4))
        self.room_waiting = False  # full, and some room freed since, less than refill_room
        self.last_fill_ms = 0
        self.horizon: int | None = None  # the bucket the last fill read up to
        self.refresh_ms = SAFETY_REFRESH_MS
        self.most_per_id = MOST_LOADED_PER_ID
        # hot ordering ids: where the first of their rows passed over lies in the store, and
        # the earliest of them in the order they run (see the module)
        self.hot: dict[str, Cursor] = {}
        self.hot_from: dict[str, tuple[int, str]] = {}
        self.last_top_up_ms = 0

    def _horizon(self, now_ms: int) -> int:
        return bucket_of(now_ms + self.lookahead_ms, self.store.bucket_seconds)

    def due_for_fill(self, now_ms: int) -> bool:
        return self._due_for_read(now_ms) or self._due_for_top_up(now_ms)

    def _due_for_read(self, now_ms: int) -> bool:
        return (self.dirty or self.horizon != self._horizon(now_ms)
                or now_ms - self.last_fill_ms >= self.refresh_ms
                or (self.room_waiting and now_ms - self.last_fill_ms >= PARTIAL_REFILL_MS))

    def _due_for_top_up(self, now_ms: int) -> bool:
        return bool(self.hot) and now_ms - self.last_top_up_ms >= TOP_UP_EVERY_MS

    def _passes_over(self, row: StoredTask, timetable: Timetable) -> bool:
        """Whether *row*, not loaded, is left in the store as one of a hot ordering id (see
        the module): it comes after the earliest of it passed over, or would load one of it
        too many and comes after every one loaded. One that comes before a loaded one takes
        the place of the last (left in the store in its turn). "Comes after" is in the order
        its tasks run (time, then uniqueness key); where to read them again from is the
        least position in the store of those passed over."""
        ordering_id = row.envelope.key.ordering_id
        order = (row.envelope.key.scheduled_ms, row.envelope.key.uniqueness_key)
        first = self.hot.get(ordering_id)
        if first is not None and order >= self.hot_from[ordering_id]:
            self.hot[ordering_id] = min(first, row.position)
            return True
        if timetable.loaded_of(ordering_id) < self.most_per_id:
            return False
        last = timetable.last_of(ordering_id)
        evicted = last is not None and last.order > order
        if evicted:
            assert last is not None
            timetable.remove(last.key)
            passed, position = last.order, last.stored.position
        else:
            passed, position = order, row.position
        self.hot[ordering_id] = position if first is None else min(first, position)
        self.hot_from[ordering_id] = passed if first is None else min(self.hot_from[ordering_id], passed)
        return not evicted

    def written_ahead(self, row: StoredTask, room: bool) -> bool:
        """*row* was just written ahead of the cursor: whether to put it straight into memory.

        Yes when there is *room*, the last fill read everything up to the horizon, *row* lies
        within it, and nothing has asked for a fill since (a row that is waiting for one may
        be an earlier task of *row*'s ordering id, which must be loaded first). Otherwise a
        fill reads it: the next one if it lies within the horizon, else the one the
        horizon's move brings.
        """
        if self.horizon is not None and row.bucket > self.horizon:
            return False  # beyond what is loaded: read when the horizon gets there
        if room and not (self.cursor is None or self.dirty or self.full or self.horizon is None):
            return True
        self.dirty = True
        return False

    def persisted(self, row: StoredTask, timetable: Timetable) -> None:
        """The ingest loop of this process wrote *row* to this partition: into *timetable* now
        if it falls within what is loaded, else read when the cursor gets there."""
        if timetable.get(row.key) is not None:
            timetable.add(loaded_from(row))  # a new version of a loaded key
        elif self._passes_over(row, timetable):
            return  # a top-up, or the fill that reaches it, reads it in its turn
        elif self.passed(row.position):
            if timetable.count(self.partition) < self.max_loaded:
                timetable.add(loaded_from(row))
            else:
                # No room: the cursor goes back to read it again. Later tasks of its ordering
                # id already here would be released before it: they leave memory too, to be
                # read again after it.
                task = loaded_from(row)
                later = timetable.waiting_after(task)
                for evicted in later:
                    timetable.remove(evicted.key)
                for position in [row.position] + [t.stored.position for t in later]:
                    self.rewind(position)
                    first = self.hot.get(position.ordering_id)
                    if first is not None and position < first:  # read again before the rest
                        self.hot[position.ordering_id] = position
                self.dirty = True
        elif self.written_ahead(row, room=timetable.count(self.partition) < self.max_loaded):
            timetable.add(loaded_from(row))  # within what is loaded: no need to read it

    def room_freed(self, loaded: int) -> None:
        """A task of this partition left memory, *loaded* remain: read on if the last fill
        ran out of room, once there is room for a page (see ``PARTIAL_REFILL_MS``).

        A fill that reached the horizon has nothing more to read until the horizon moves
        (the periodic fill) or ingest writes ahead of the cursor (which marks it dirty).
        """
        if self.full:
            if self.max_loaded - loaded >= self.refill_room:
                self.dirty = True
            else:
                self.room_waiting = True

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
        """Top the hot ordering ids up, and load rows up to the horizon while there is room
        (each when due); return how many were added."""
        added = self._top_up(timetable, now_ms) if self._due_for_top_up(now_ms) else 0
        if self._due_for_read(now_ms):
            added += self._read_on(timetable, now_ms)
        return added

    def _top_up(self, timetable: Timetable, now_ms: int) -> int:
        """Load the rows of each hot ordering id with half its most loaded or fewer, from the
        first passed over on, up to the cursor (what lies beyond, the fill reads)."""
        self.last_top_up_ms = now_ms
        return sum(self._top_up_one(timetable, ordering_id, first)
                   for ordering_id, first in list(self.hot.items())
                   if timetable.loaded_of(ordering_id) <= self.most_per_id // 2)

    def _top_up_one(self, timetable: Timetable, ordering_id: str, first: Cursor) -> int:
        added = 0
        position, inclusive = first, True
        del self.hot[ordering_id]  # hot again if it passes a row over again
        del self.hot_from[ordering_id]
        try:
            while self.cursor is not None and position < self.cursor:
                rows = self.store.read(self.partition, position, self.page_size, inclusive)
                for row in rows:
                    if not self.passed(row.position):
                        return added  # the fill's own, from here
                    if row.envelope.key.ordering_id == ordering_id and row.key not in timetable:
                        if timetable.count(self.partition) >= self.max_loaded:
                            self._pass_from(ordering_id, row.position, timetable)
                            return added  # no room: read from here once there is
                        if self._passes_over(row, timetable):
                            return added  # hot again, from there
                        if timetable.add(loaded_from(row)):
                            added += 1
                    position, inclusive = row.position, False
                if len(rows) == self.page_size:
                    continue
                following = self.store.buckets(self.partition, position.bucket + 1,
                                               self.cursor.bucket, limit=1)
                if not following:
                    break
                position, inclusive = Cursor(following[0]), False
            return added
        except BaseException:
            if ordering_id not in self.hot:  # cut short (a store error): read again from here
                self._pass_from(ordering_id, position, timetable)
            raise

    def _pass_from(self, ordering_id: str, position: Cursor, timetable: Timetable) -> None:
        """*ordering_id* is hot again: read again from *position*; a row of it written from
        now on that comes after every one loaded is passed over."""
        self.hot[ordering_id] = position
        last = timetable.last_order(ordering_id)
        self.hot_from[ordering_id] = (last[0], last[1] + "\0") if last is not None else (-1, "")

    def _read_on(self, timetable: Timetable, now_ms: int) -> int:
        horizon = self._horizon(now_ms)
        added = 0
        if self.cursor is None:
            first = self.store.buckets(self.partition, 0, horizon, limit=1)
            if not first:
                self._filled(now_ms, horizon)
                return 0
            self.cursor, self.inclusive = Cursor(first[0]), False
        passing = False  # rows of a hot ordering id passed over: they take no room
        while timetable.count(self.partition) < self.max_loaded:
            # as many as there is room for, or a page once rows are passed over
            size = self.page_size if passing else min(self.page_size,
                                                      self.max_loaded - timetable.count(self.partition))
            rows = self.store.read(self.partition, self.cursor, size, self.inclusive)
            for row in rows:
                if row.key not in timetable:
                    if self._passes_over(row, timetable):
                        passing = True
                    elif timetable.count(self.partition) >= self.max_loaded:
                        break  # no room: read from here once there is
                    elif timetable.add(loaded_from(row)):
                        added += 1
                self.cursor, self.inclusive = row.position, False
            else:
                if len(rows) == size:
                    continue  # maybe more in this bucket
                if not self._next_bucket(horizon, now_ms, emptied=not rows):
                    break
                continue
            break
        self.full = timetable.count(self.partition) >= self.max_loaded
        self._filled(now_ms, horizon)
        return added

    def _filled(self, now_ms: int, horizon: int) -> None:
        # Only a fill that read to its end counts: one a store error cut short is made again.
        self.dirty, self.last_fill_ms, self.horizon = False, now_ms, horizon
        self.room_waiting = False

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
