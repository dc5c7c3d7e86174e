"""Periodic entries and their occurrences: when an entry fires, and the key of each run.

Pure: no clock, no I/O. An entry fires at occurrence times computed by Celery's own schedule
classes, in the app's timezone; each occurrence is to be run as a scheduled task whose key is
made from the entry and the occurrence alone::

    ordering id     periodic:<entry name>
    scheduled time  the occurrence (plus the entry's jitter, the same wherever it is computed)
    uniqueness key  the occurrence, as ISO 8601 UTC

so that any number of processes computing the same occurrence make the same key, and the
scheduler's dedupe by key runs it once; and an entry's occurrences share an ordering id, so
they run one after another, in order, never side by side. An entry whose ``overlap`` is
``"allow_all"`` gives each occurrence an ordering id of its own, in the entry's partition
(:func:`ordering_id_of`), so that its runs may go on side by side. Reading the entries of ``beat_schedule``
(and of changes made at run time) is :mod:`celery_scheduler.periodic_entries`.

Where this differs from celery beat (which keeps a last-run time per entry in one process):

- an interval (a number of seconds, a ``timedelta``, ``schedule(run_every=...)``) fires at
  the multiples of the interval since the Unix epoch, whatever ``relative`` says, so that
  every process agrees without sharing a start time; a new entry first fires at the next
  multiple, not at once (celery beat runs a new interval entry as soon as it starts);
- after downtime, the entry's ``catch_up`` says which missed occurrences run: ``"last"``
  (the default: the most recent missed one, as celery beat runs a due entry once), ``"all"``
  (each, once) or ``"none"``; occurrences missed by less than two minutes (a partition's
  hand-over, a short outage) all run, whatever it says;
- a ``crontab`` is read by Celery's own ``crontab`` (its fields, its day-of-week numbering,
  its handling of daylight saving time); two occurrences that fall on one instant (a wall
  time that a clock change skips lands on the next hour's) are one;
- a ``solar`` event is found as Celery's ``solar`` finds it (with ``ephem``, from the
  schedule's own observer), each occurrence at the event's time to the millisecond; a day
  without the event (a polar day or night) has no occurrence, and an entry whose event does
  not happen within :data:`SOLAR_SEARCH_DAYS` has ended.
"""

from __future__ import annotations

import datetime as dt
import enum
import hashlib
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from celery.schedules import crontab, schedule, solar

from celery_scheduler.envelope import RetryPolicy, ScheduleEnvelope
from celery_scheduler.errors import PeriodicEntryError
from celery_scheduler.keys import MAX_MS, TaskKey, to_epoch_ms

__all__ = ["PERIODIC_PREFIX", "CatchUp", "Entry", "Overlap", "entry_name_of", "envelope_of",
           "every", "key", "missed", "next_occurrence", "occurrences", "ordering_id_of", "to_fire"]

PERIODIC_PREFIX = "periodic:"
# The keys celery beat reads in an entry; the options that are the package's own.
CELERY_KEYS = frozenset(("task", "schedule", "args", "kwargs", "options", "relative"))
OWN_KEYS = frozenset(("catch_up", "jitter", "overlap", "start", "until", "count"))
# Occurrences missed by less than this run, each once, whatever the entry's catch_up: a
# partition's hand-over (seconds after a dispatcher dies; tens of seconds when faults
# overlap) must not skip an occurrence.
HAND_OVER_MS = 120_000
# The most occurrences one call returns: a minute's crontab over a week of downtime is 10,080.
MAX_OCCURRENCES = 100_000
# How far ahead a solar event is looked for: more than a year, so that the sun's rising at a
# pole, once a year, is found.
SOLAR_SEARCH_DAYS = 400
_UTC = dt.timezone.utc
# The end of an allow_all occurrence's ordering id: "@", the occurrence, and "#n" when n > 0.
OCCURRENCE_SUFFIX = re.compile(r"@\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00(#\d+)?$")
# More than enough tries to land in one partition of any topic (about as many as it has).
_SALT_TRIES = 1_000_000
LONGEST_SUFFIX = len(f"@2000-01-01T00:00:00.000+00:00#{_SALT_TRIES}")


class CatchUp(str, enum.Enum):
    """Which occurrences missed while nothing ran (the dispatchers were down) still run."""

    LAST = "last"  # the most recent one: what celery beat does
    ALL = "all"  # each of them, once
    NONE = "none"  # none: the next occurrence runs as usual


class Overlap(str, enum.Enum):
    """What an occurrence does when the entry's run before it has not finished (Temporal's
    overlap policies, as far as one entry's runs never run side by side)."""

    BUFFER_ALL = "buffer_all"  # it waits, and runs after (the default)
    BUFFER_ONE = "buffer_one"  # it waits, unless one is already waiting: then it is skipped
    SKIP = "skip"  # it is skipped
    ALLOW_ALL = "allow_all"  # it runs at its time, beside the runs before it

    @property
    def looks_back(self) -> bool:
        """Whether an occurrence looks at the run before it to know whether it runs."""
        return self in (Overlap.BUFFER_ONE, Overlap.SKIP)


@dataclass(frozen=True, slots=True)
class Entry:
    """One periodic entry, checked: *schedule* is Celery's (``schedule``, ``crontab`` or
    ``solar``)."""

    name: str
    task: str
    schedule: schedule | crontab | solar
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    catch_up: CatchUp = CatchUp.LAST
    jitter_ms: int = 0
    overlap: Overlap = Overlap.BUFFER_ALL
    start_ms: int | None = None  # no occurrence before
    until_ms: int | None = None  # none after (a count is turned into this)

    @property
    def ordering_id(self) -> str:
        return PERIODIC_PREFIX + self.name


def every(spec: schedule) -> dt.timedelta:
    """An interval schedule's ``run_every`` (Celery keeps it as a timedelta)."""
    every: dt.timedelta = cast(Any, spec).run_every  # celery-types does not declare it
    return every


def _interval(every_ms: int, after_ms: int, until_ms: int) -> Iterator[int]:
    at = (after_ms // every_ms + 1) * every_ms
    while at <= until_ms:
        yield at
        at += every_ms


def _crontab(spec: crontab, after_ms: int, until_ms: int, tz: dt.tzinfo) -> Iterator[int]:
    # Celery's crontab counts from a previous run, to the minute: start from the minute
    # boundary at or before *after*, and keep what lies after it.
    start = (after_ms // 60_000) * 60_000
    moment = dt.datetime.fromtimestamp(start / 1000, _UTC).astimezone(tz)
    previous = start
    while True:
        last, delta, _ = spec.remaining_delta(moment, tz=tz)
        if last + delta <= last:
            raise PeriodicEntryError(repr(spec), f"crontab gave no time after {last}")
        moment = last + delta
        at = to_epoch_ms(moment, tz)
        if at > until_ms:
            return
        if at > after_ms and at > previous:  # one instant twice (a clock change) is one
            yield at
            previous = at


def _solar(event_of: solar, after_ms: int, until_ms: int) -> Iterator[int]:
    # ephem's dates are UTC days; an event may fall between two milliseconds, so each
    # search starts just after the one found, and what rounds to *after* or before is not kept
    spec: Any = event_of  # celery-types does not declare solar's observer and method
    ephem = spec.ephem
    sun = ephem.Sun()
    extra = {"use_center": True} if spec.use_center else {}
    find = getattr(spec.cal, spec.method)
    start = ephem.Date(dt.datetime.fromtimestamp(after_ms / 1000, _UTC).replace(tzinfo=None))
    while True:
        searched_from = start
        while True:
            try:
                event = find(sun, start=start, **extra)
                break
            except ephem.CircumpolarError:  # not on this day: from the next one
                start = spec.cal.next_antitransit(sun, start=start)
                if start - searched_from > SOLAR_SEARCH_DAYS:
                    return
        at = round(event.datetime().replace(tzinfo=_UTC).timestamp() * 1000)
        if at > until_ms:
            return
        if at > after_ms:
            yield at
            after_ms = at
        start = ephem.Date(event + ephem.second / 1000)


def _times(entry: Entry, after_ms: int, until_ms: int, tz: dt.tzinfo) -> Iterator[int]:
    spec = entry.schedule
    if isinstance(spec, crontab):
        return _crontab(spec, after_ms, until_ms, tz)
    if isinstance(spec, solar):
        return _solar(spec, after_ms, until_ms)
    return _interval(max(1, int(every(spec).total_seconds() * 1000)), after_ms, until_ms)


def occurrences(entry: Entry, after_ms: int, until_ms: int, tz: dt.tzinfo,
                limit: int | None = None) -> list[int]:
    """The entry's occurrences after *after_ms* up to *until_ms* (epoch ms, both UTC), in
    order, at most *limit*; *tz* is the app's timezone (a crontab's wall times are in it)."""
    found: list[int] = []
    if entry.start_ms is not None:
        after_ms = max(after_ms, entry.start_ms - 1)
    if entry.until_ms is not None:
        until_ms = min(until_ms, entry.until_ms)
    if until_ms <= after_ms:
        return found
    for at in _times(entry, after_ms, until_ms, tz):
        found.append(at)
        if limit is not None and len(found) == limit:
            break
        if len(found) > MAX_OCCURRENCES:
            raise PeriodicEntryError(entry.name, f"more than {MAX_OCCURRENCES:,} occurrences "
                                                 f"between two times: ask for a shorter span")
    return found


def _jitter(entry: Entry, occurrence_ms: int) -> int:
    if not entry.jitter_ms:
        return 0
    digest = hashlib.sha256(f"{entry.name}@{occurrence_ms}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % entry.jitter_ms


def _iso(occurrence_ms: int) -> str:
    return dt.datetime.fromtimestamp(occurrence_ms / 1000, _UTC).isoformat(timespec="milliseconds")


def ordering_id_of(entry: Entry, occurrence_ms: int, partition_of: Callable[[str], int] | None
                   ) -> str:
    """The ordering id of the entry's occurrence at *occurrence_ms*: the entry's, or for an
    ``allow_all`` entry one of the occurrence's own: the entry's, ``@`` and the occurrence,
    then ``#n`` for the least n (none for 0) that puts it in the entry's partition, by
    *partition_of* (the topic's partitioner). So the dispatcher that fires the entry releases
    its runs, and a cancel or a status read by key finds each where it finds the entry's."""
    if entry.overlap is not Overlap.ALLOW_ALL:
        return entry.ordering_id
    if partition_of is None:
        raise ValueError(f"entry {entry.name!r} is allow_all: its keys need the topic's partitioner")
    home = partition_of(entry.ordering_id)
    base = f"{entry.ordering_id}@{_iso(occurrence_ms)}"
    for n in range(_SALT_TRIES):
        candidate = f"{base}#{n}" if n else base
        if partition_of(candidate) == home:
            return candidate
    raise ValueError(f"no ordering id of {base!r} lands in partition {home}")


def entry_name_of(ordering_id: str) -> str | None:
    """The name of the entry an occurrence's ordering id belongs to (None: not periodic)."""
    if not ordering_id.startswith(PERIODIC_PREFIX):
        return None
    return OCCURRENCE_SUFFIX.sub("", ordering_id[len(PERIODIC_PREFIX):])


def key(entry: Entry, occurrence_ms: int, partition_of: Callable[[str], int] | None = None
        ) -> TaskKey:
    """The task key of the entry's occurrence at *occurrence_ms*: the same wherever computed
    (*partition_of*, the topic's partitioner, is needed for an ``allow_all`` entry)."""
    return TaskKey(ordering_id_of(entry, occurrence_ms, partition_of),
                   occurrence_ms + _jitter(entry, occurrence_ms), _iso(occurrence_ms))


def envelope_of(entry: Entry, occurrence: TaskKey, retry: RetryPolicy, enqueued_ms: int
                ) -> ScheduleEnvelope:
    """The task of the entry's occurrence whose key is *occurrence* (:func:`key`): the entry's
    task, arguments and Celery options."""
    return ScheduleEnvelope(key=occurrence, task=entry.task, args=list(entry.args),
                            kwargs=dict(entry.kwargs), options=dict(entry.options), retry=retry,
                            enqueued_ms=enqueued_ms)


def missed(entry: Entry, last_ms: int | None, now_ms: int, tz: dt.tzinfo) -> list[int]:
    """The occurrences after *last_ms* (the last one scheduled; None for a new entry, which
    has missed nothing) up to *now_ms* that still run.

    Those less than :data:`HAND_OVER_MS` old all run: the gap of a partition's hand-over (a
    dispatcher that died, a rebalance) or of a short outage is not downtime. Older ones run
    as the entry's ``catch_up`` says, ``"last"`` only if no recent one runs for them.
    """
    if last_ms is None:
        return []
    found = occurrences(entry, last_ms, now_ms, tz)
    recent = [at for at in found if at > now_ms - HAND_OVER_MS]
    older = found[:len(found) - len(recent)]
    if entry.catch_up is CatchUp.NONE:
        older = []
    elif entry.catch_up is CatchUp.LAST:
        older = [] if recent else older[-1:]
    return older + recent


def next_occurrence(entry: Entry, after_ms: int, tz: dt.tzinfo) -> int | None:
    """The entry's first occurrence after *after_ms* (None: it has ended, ``until``/``count``)."""
    if entry.start_ms is not None:
        after_ms = max(after_ms, entry.start_ms - 1)
    at = next(_times(entry, after_ms, MAX_MS, tz), None)
    return None if at is None or (entry.until_ms is not None and at > entry.until_ms) else at


def to_fire(entry: Entry, last_ms: int | None, now_ms: int, ahead_ms: int, tz: dt.tzinfo
            ) -> list[int]:
    """The occurrences to schedule now: those missed since *last_ms* (the last occurrence
    already scheduled; None for a new entry, which catches nothing up), as the entry's
    ``catch_up`` says, then those due up to *ahead_ms* from *now_ms* not scheduled yet."""
    after = now_ms if last_ms is None else max(now_ms, last_ms)
    return missed(entry, last_ms, now_ms, tz) + occurrences(entry, after, now_ms + ahead_ms, tz)
