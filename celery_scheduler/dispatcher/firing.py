"""Which occurrences of the periodic entries (``beat_schedule``) this dispatcher schedules, and
when: pure, no clock and no I/O.

An entry belongs to the partition of its ordering id (``periodic:<name>``), so exactly one
dispatcher fires it: the one that may write that partition (it holds the partition's lease).
An occurrence is scheduled as a task with the key :func:`celery_scheduler.periodic.key`
gives it, written through the same path as a schedule record read from Kafka, so the key's
dedupe makes an occurrence written twice (by an owner that died before it noted it, then by
the next) run once.

What was fired last is kept in the store for each entry, and read when the partition is
taken: a new owner fires neither what the last one fired nor, for a new entry, what fell due
before it existed; after a time with no owner, the entry's ``catch_up`` says which missed
occurrences still run. Fired occurrences are noted only once the store acknowledged their
tasks, so a crash between the two fires them again, under the same keys.

Each entry's next occurrence waits in a heap of times, so a step costs one comparison when
nothing is due, whatever the number of entries.
"""

from __future__ import annotations

import datetime as dt
import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple

from celery.schedules import crontab, solar

from celery_scheduler.keys import TaskKey
from celery_scheduler.periodic import Entry, every, key, missed, next_occurrence, occurrences

__all__ = ["Firing", "Occurrence"]

MEMO_SIZE = 4096
DAY_MS = 86_400_000


class Occurrence(NamedTuple):
    """One run of *entry*, at *at_ms* (its occurrence, before jitter), in *partition*."""

    entry: Entry
    partition: int
    at_ms: int


class Firing:
    """The periodic entries of the partitions this process may write, and their next times.

    *partition_of* maps an ordering id to its partition; *ahead_ms* is how long before its
    time an occurrence is scheduled (time for its task to be written and loaded).
    """

    def __init__(self, entries: Sequence[Entry], partition_of: Callable[[str], int],
                 tz: dt.tzinfo, ahead_ms: int, floors: Mapping[str, int] | None = None) -> None:
        self._tz = tz
        self._ahead_ms = ahead_ms
        self._partition_of = partition_of
        self._entries: dict[int, list[Entry]] = {}
        self._partition: dict[str, int] = {}
        self._by_name: dict[str, Entry] = {}
        self._floors: dict[str, int] = {}
        self._set(entries, floors or {})
        # partitions whose entries are fired here: what each fired last (None: nothing yet)
        self._last: dict[int, dict[str, int | None]] = {}
        # occurrences found missed when a partition was taken, not scheduled yet
        self._missed: list[Occurrence] = []
        # the next occurrence of each entry of a taken partition; a heap of those times, and
        # the entries waiting for each: an entry listed at a time that is no longer its next
        # is stale there, and skipped. Entries that share a crontab share one time (one heap
        # item and one list for thousands of them: a dispatcher holds every entry)
        self._next: dict[str, int] = {}
        self._times: list[int] = []
        self._waiting: dict[int, list[str]] = {}
        # (schedule, start, until, after) -> next occurrence: see _schedule
        self._computed: dict[tuple[str, int | None, int | None, int], int | None] = {}

    def _set(self, entries: Sequence[Entry], floors: Mapping[str, int]) -> None:
        self._entries = {}
        for entry in entries:
            self._entries.setdefault(self._partition_of(entry.ordering_id), []).append(entry)
        self._partition = {entry.name: partition for partition, group in self._entries.items()
                           for entry in group}
        self._by_name = {entry.name: entry for entry in entries}
        self._floors = dict(floors)

    def update(self, entries: Sequence[Entry], floors: Mapping[str, int]) -> None:
        """The entries in force are now *entries* (changed at run time), none of them firing
        before its floor (when it was resumed): a partition whose entries changed is taken
        again, reading what the store says they fired."""
        old, old_floors = self._entries, self._floors
        self._set(entries, floors)

        def state(group: dict[int, list[Entry]], bounds: Mapping[str, int], partition: int
                  ) -> list[tuple[Entry, int | None]]:
            return [(entry, bounds.get(entry.name)) for entry in group.get(partition, ())]

        self.dropped([p for p in set(old) | set(self._entries)
                      if state(old, old_floors, p) != state(self._entries, self._floors, p)])

    @property
    def partitions(self) -> frozenset[int]:
        """The partitions that have entries."""
        return frozenset(self._entries)

    def to_take(self, writable: Iterable[int]) -> list[int]:
        """Of *writable* (the partitions this process may write now), those with entries whose
        last fired times must be read before they fire here."""
        return sorted(p for p in writable if p in self._entries and p not in self._last)

    def taken(self, partition: int, last_fired: Mapping[str, int], now_ms: int) -> None:
        """The partition's entries fire here from now; *last_fired* is what the store holds
        (entries it does not name never fired)."""
        lasts: dict[str, int | None] = {}
        for entry in self._entries.get(partition, ()):
            last = last_fired.get(entry.name)
            floor = self._floors.get(entry.name)
            if floor is not None:  # resumed: nothing before it fires
                last = floor if last is None else max(last, floor)
            lasts[entry.name] = last
            self._missed.extend(Occurrence(entry, partition, at)
                                for at in missed(entry, last, now_ms, self._tz))
            self._schedule(entry.name, now_ms if last is None else max(now_ms, last))
        self._last[partition] = lasts

    def _schedule(self, name: str, after_ms: int) -> None:
        entry = self._by_name[name]
        # Entries that share a crontab (thousands of hourly reports at :00) share their next
        # occurrence: one costs 150 us through Celery, which took 3 s of a take of 20,000
        # such entries, 0.4 s with this (under load). A solar event is kept likewise (about
        # 100 us, more where the event skips days). An interval's is arithmetic: not kept.
        if not isinstance(entry.schedule, (crontab, solar)):
            at = next_occurrence(entry, after_ms, self._tz)
        elif (memo := (repr(entry.schedule), entry.start_ms, entry.until_ms, after_ms)) in self._computed:
            at = self._computed[memo]
        else:
            if len(self._computed) >= MEMO_SIZE:
                self._computed.clear()
            at = self._computed[memo] = next_occurrence(entry, after_ms, self._tz)
        if at is None:  # the entry has ended (until, count)
            self._next.pop(name, None)
            return
        self._next[name] = at
        names = self._waiting.get(at)
        if names is None:
            self._waiting[at] = [name]
            heapq.heappush(self._times, at)
        else:
            names.append(name)

    def dropped(self, partitions: Iterable[int]) -> list[str]:
        """These partitions fire elsewhere now (their lease was lost or given up); the names
        of the entries that went with them."""
        gone = {p for p in partitions if p in self._last}
        names: list[str] = []
        for partition in gone:
            for name in self._last.pop(partition):
                self._next.pop(name, None)
                names.append(name)
        if gone:
            self._missed = [o for o in self._missed if o.partition not in gone]
        return names

    def due(self, now_ms: int) -> list[Occurrence]:
        """The occurrences to schedule now: those missed, then those up to *ahead_ms* ahead.
        Each stays due until :meth:`fired` says its task was written."""
        found = list(self._missed)
        horizon = now_ms + self._ahead_ms
        for at, name in self._upcoming(horizon):
            if self._due_at(self._by_name[name], at) <= now_ms:
                found.append(Occurrence(self._by_name[name], self._partition[name], at))
        return found

    def _due_at(self, entry: Entry, at: int) -> int:
        """When the occurrence at *at* is written: *ahead_ms* before it, or at its time for an
        entry whose overlap policy looks at the run before it (so it looks as late as it can)."""
        return at if entry.overlap.looks_back else at - self._ahead_ms

    def _upcoming(self, horizon: int) -> list[tuple[int, str]]:
        """The (occurrence, entry) waiting up to *horizon*, in time order; stale ones dropped
        (fired, dropped, or listed twice: an entry taken again)."""
        found: list[tuple[int, str]] = []
        kept: list[int] = []
        while self._times and self._times[0] <= horizon:
            at = heapq.heappop(self._times)
            names = self._waiting.pop(at)
            live = [name for name in dict.fromkeys(names) if self._next.get(name) == at]
            if live:
                self._waiting[at] = live
                kept.append(at)
                found.extend((at, name) for name in live)
        for at in kept:
            heapq.heappush(self._times, at)
        return found

    def next_at(self) -> int | None:
        """When an occurrence is next written (None: no entry fires here)."""
        if self._missed:
            return min(o.at_ms for o in self._missed)
        while self._times and not any(self._next.get(name) == self._times[0]
                                      for name in self._waiting[self._times[0]]):
            del self._waiting[heapq.heappop(self._times)]  # stale
        if not self._times:
            return None
        return min(self._due_at(self._by_name[name], at)
                   for at, name in self._upcoming(self._times[0] + self._ahead_ms))

    def entry(self, name: str) -> Entry:
        return self._by_name[name]

    def earlier(self, entry: Entry, at_ms: int, count: int) -> list[int]:
        """Up to *count* occurrences of *entry* before *at_ms*, the latest last (an interval's
        looked for over *count* intervals, a crontab's or solar event's over the day before)."""
        span = DAY_MS if isinstance(entry.schedule, (crontab, solar)) else (
            int(every(entry.schedule).total_seconds() * 1000) * (count + 1))
        return occurrences(entry, at_ms - span, at_ms - 1, self._tz)[-count:]

    def key_of(self, entry: Entry, at_ms: int) -> TaskKey:
        """The task key of *entry*'s occurrence at *at_ms* (:func:`celery_scheduler.periodic.key`)."""
        return key(entry, at_ms, self._partition_of)

    def written_ahead(self, name: str, now_ms: int, replacement: Entry | None
                      ) -> tuple[int, list[TaskKey], list[TaskKey]] | None:
        """What withdraws entry *name*'s occurrences written (here, or by the owner before)
        whose time has not come at *now_ms*, now that *replacement* is in force instead of it
        (None: paused or deleted): its partition, the keys *replacement* has too (to write
        again by it, as a pending task is rewritten in place), and the keys to cancel. None
        when nothing waits."""
        entry, last, partition = self._by_name.get(name), self.last_of(name), self._partition.get(name)
        if entry is None or last is None or partition is None or last <= now_ms - entry.jitter_ms:
            return None
        ahead = [(at, found) for at in occurrences(entry, now_ms - entry.jitter_ms, last, self._tz)
                 if (found := self.key_of(entry, at)).scheduled_ms > now_ms]
        if not ahead:
            return None
        kept: set[int] = set()
        if replacement is not None:
            kept = set(occurrences(replacement, ahead[0][0] - 1, ahead[-1][0], self._tz))
        rewrite = [found for at, found in ahead
                   if replacement is not None and at in kept and self.key_of(replacement, at) == found]
        return partition, rewrite, [found for _, found in ahead if found not in rewrite]

    def last_of(self, name: str) -> int | None:
        """The latest occurrence of entry *name* fired here or read from the store."""
        partition = self._partition.get(name)
        return None if partition is None else self._last.get(partition, {}).get(name)

    def fired(self, occurrences: Iterable[Occurrence]) -> dict[int, dict[str, int]]:
        """Note *occurrences* as written; returns what to keep in the store, by partition:
        each entry's latest occurrence written."""
        written: dict[int, dict[str, int]] = {}
        done: set[tuple[str, int]] = set()
        for occurrence in occurrences:
            name = occurrence.entry.name
            done.add((name, occurrence.at_ms))
            lasts = self._last.get(occurrence.partition)
            if lasts is None:
                continue  # dropped meanwhile: its new owner reads what the store holds
            before = lasts.get(name)
            if before is None or occurrence.at_ms > before:
                lasts[name] = occurrence.at_ms
                written.setdefault(occurrence.partition, {})[name] = occurrence.at_ms
            upcoming = self._next.get(name)
            if upcoming is not None and upcoming <= occurrence.at_ms:
                self._schedule(name, occurrence.at_ms)
        self._missed = [o for o in self._missed if (o.entry.name, o.at_ms) not in done]
        return written
