"""The periodic entries this dispatcher fires, scheduled through its own write path.

:mod:`celery_scheduler.dispatcher.firing` decides; this module reads what the store says was
fired when a partition is taken, writes each due occurrence as a task the way the ingest
loop writes a schedule record read from Kafka (the key's status read first, the write
fenced by the partition's lease, the engine told of the row), and then notes the fires. It
runs on the ingest loop's thread, between two polls: a partition's writes come from one
thread, and a key the engine is marking is waited for, as for any record (see claims.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

from celery_scheduler import periodic_changes, registry
from celery_scheduler.clock import Clock, now_ms
from celery_scheduler.config import Settings
from celery_scheduler.dispatcher.firing import Firing, Occurrence
from celery_scheduler.envelope import RetryPolicy
from celery_scheduler.errors import LeaseEndedError, PeriodicEntryError, SchedulerError
from celery_scheduler.outages import Outages
from celery_scheduler.partitioner import partition_for
from celery_scheduler.periodic import Entry, Overlap, envelope_of
from celery_scheduler.periodic_entries import app_entries
from celery_scheduler.store.base import Cancel, Operation, Put, ScheduleStore, State

__all__ = ["CHANGES_EVERY_MS", "Firer", "firer_of"]

logger = logging.getLogger(__name__)

# How many occurrences before the last one fired a new owner looks through for the run before
# (skip, buffer_one), when the owner before skipped the last one.
LOOK_BACK = 20
# How often the changes made to entries at run time are read (one small request).
CHANGES_EVERY_MS = 2_000


class Firer:
    """Fires the due occurrences of the entries of the partitions this process may write.

    *write* applies operations as the ingest loop does (:meth:`Ingest.apply`); *may_write*
    says whether this process may write a partition now (its engine holds the lease);
    *retry_of* gives a task name's retry policy (the scheduled task's, or the settings');
    *certain* whether the lease is certainly still held by this process's clock (a process
    paused past its lease end has not yet been told it lost it).
    """

    def __init__(self, plan: Firing, store: ScheduleStore,
                 write: Callable[[Sequence[Operation]], object],
                 may_write: Callable[[int], bool], retry_of: Callable[[str], RetryPolicy],
                 clock: Clock | None = None, code: Sequence[Entry] = (),
                 known_tasks: Callable[[], Collection[str]] | None = None,
                 changes_every_ms: int = CHANGES_EVERY_MS,
                 certain: Callable[[int], bool] | None = None) -> None:
        self.plan = plan
        # whether the lease is certainly still this process's, by its own clock (asked again
        # once a decision is made: see _still_held); may_write if not given
        self.certain = certain or may_write
        self.store = store
        self.write = write
        self.may_write = may_write
        self.retry_of = retry_of
        self.clock = clock or now_ms
        self.fired_count = 0
        self._outages: Outages[str] = Outages()
        # the app's beat_schedule, and the entries in force once changes at run time apply
        self._code = list(code)
        self._known_tasks = known_tasks
        self._in_force: tuple[list[Entry], dict[str, int]] = (list(code), {})
        self._changes_every_ms = changes_every_ms
        self._changes_read_ms: int | None = None
        # each entry's latest occurrence written here (not skipped): its run is the one before
        self._written: dict[str, int] = {}

    def step(self) -> int:
        """Fire what is due; how many occurrences were written. A store outage is said once,
        with its end, and the same occurrences are tried again at the next step."""
        try:
            fired = self._step()
        except SchedulerError as exc:
            if self._outages.failed(type(exc).__name__, time.monotonic()):
                logger.warning("could not fire periodic entries (%s); trying again at every "
                               "step, and saying so once it works", exc)
            return 0
        for ended in self._outages.all_recovered(time.monotonic()) if self._outages else ():
            logger.warning("periodic entries fire again (%s): %s", ended.key,
                           ended.describe("they failed"))
        return fired

    def _read_changes(self, now: int) -> None:
        """Apply the changes made at run time (every CHANGES_EVERY_MS)."""
        if self._changes_read_ms is not None and now - self._changes_read_ms < self._changes_every_ms:
            return
        changes = self.store.entry_changes()
        self._changes_read_ms = now
        in_force = periodic_changes.in_force(
            self._code, changes, None if self._known_tasks is None else self._known_tasks())
        if in_force != self._in_force:
            before = {entry.name for entry in self._in_force[0]}
            after = {entry.name for entry in in_force[0]}
            logger.info("periodic entries changed at run time: %d in force%s%s", len(after),
                        f", no longer {sorted(before - after)}" if before - after else "",
                        f", now also {sorted(after - before)}" if after - before else "")
            self._withdraw(in_force[0], now)
            self._in_force = in_force
            self.plan.update(*in_force)

    def _withdraw(self, after: Sequence[Entry], now: int) -> None:
        """The occurrences written ahead of their time by a definition no longer in force (its
        entry paused, deleted or changed) are cancelled, but those the new definition has too,
        which are written again by it. The entry's last fired is noted as *now*: a changed
        entry fires by its new definition from its next occurrence on."""
        replacing = {entry.name: entry for entry in after}
        for entry in self._in_force[0]:
            new = replacing.get(entry.name)
            if new == entry:
                continue
            withdrawn = self.plan.written_ahead(entry.name, now, new)
            if withdrawn is None:
                continue
            partition, rewrite, cancel = withdrawn
            operations: list[Operation] = [Cancel(partition, found) for found in cancel]
            if new is not None:
                retry = self.retry_of(new.task)
                operations += [Put(partition, envelope_of(new, found, retry, now)) for found in rewrite]
            self.write(operations)
            self.store.note_fired(partition, {entry.name: now})
            self._written.pop(entry.name, None)
            logger.info("periodic entry %r %s: of its occurrences written ahead, %d cancelled, %d "
                        "written again by its new definition", entry.name,
                        "changed" if new is not None else "paused or deleted", len(cancel), len(rewrite))

    def _step(self) -> int:
        self._read_changes(self.clock())
        writable = [p for p in self.plan.partitions if self.may_write(p)]
        # What this process wrote of an entry that fires elsewhere now is not the run before
        # its next occurrence once it fires here again: the owner meanwhile may have fired since.
        for name in self.plan.dropped(p for p in self.plan.partitions if p not in writable):
            self._written.pop(name, None)
        now = self.clock()
        for partition in self.plan.to_take(writable):
            self.plan.taken(partition, self.store.last_fired(partition), now)
        due = self.plan.due(now)
        if not due:
            return 0
        due, written = self._still_held(due, self._kept_by_overlap(due))
        # each key once (an allow_all one hashes until it lands in the entry's partition), and
        # no lookups in a list: a minute's firing may be thousands of occurrences
        keys = {id(o): self.plan.key_of(o.entry, o.at_ms) for o in due}
        kept = {id(o) for o in written}
        try:
            # decided from what was read: a write the lease's end would hold at its fence is
            # not sent (a pause since _still_held), as the next owner may have decided otherwise
            with self.store.refusing_late_writes():
                if written:
                    self.write([Put(o.partition, envelope_of(o.entry, keys[id(o)],
                                                             self.retry_of(o.entry.task), now))
                                for o in written])
                for partition, fired in self.plan.fired(due).items():
                    self.store.note_fired(partition, fired)
        except LeaseEndedError as exc:
            logger.warning("did not fire periodic entries: %s", exc)
            return 0
        for occurrence in due:
            found = keys[id(occurrence)]
            if id(occurrence) in kept:
                self._written[occurrence.entry.name] = occurrence.at_ms
                logger.info("fired periodic entry %r for %s", occurrence.entry.name, found)
            else:
                logger.info("skipped periodic entry %r at %s: its run before had not finished "
                            "(overlap %s)", occurrence.entry.name, found.scheduled_at,
                            occurrence.entry.overlap.value)
        self.fired_count += len(written)
        return len(written)

    def _still_held(self, due: list[Occurrence], written: list[Occurrence]
                    ) -> tuple[list[Occurrence], list[Occurrence]]:
        """*due* and *written*, but those of partitions this process may no longer write.

        Deciding took store reads, long enough for this process to be paused past a lease
        (SIGSTOP, a long pause of the VM) while the next owner decided the same occurrences
        otherwise: what it decided for a partition it no longer holds is not its to write.
        """
        held = {p for p in {o.partition for o in due} if self.may_write(p) and self.certain(p)}
        return [o for o in due if o.partition in held], [o for o in written if o.partition in held]

    def _kept_by_overlap(self, due: list[Occurrence]) -> list[Occurrence]:
        """The occurrences to write: all of them, but those an entry's overlap policy skips
        because the run before has not finished (``skip``) or not started (``buffer_one``)."""
        looked = {o.entry.name for o in due if o.entry.overlap.looks_back}
        before = {name: at for name in looked
                  if (at := self._written.get(name, self.plan.last_of(name))) is not None}
        found = self.store.statuses([self.plan.key_of(self.plan.entry(name), at)
                                     for name, at in before.items()])
        states: dict[str, State | None] = {name: status.state if status is not None else None
                                           for name, status in zip(before, found, strict=True)}
        # What the store says an entry fired last may be an occurrence the owner before skipped
        # (never written): the run before is then the latest occurrence it wrote before that.
        for name in [n for n, state in states.items() if state is None and n not in self._written]:
            entry = self.plan.entry(name)
            earlier = self.plan.earlier(entry, before[name], LOOK_BACK)
            found = self.store.statuses([self.plan.key_of(entry, at) for at in earlier])
            written = [(at, status) for at, status in zip(earlier, found, strict=True) if status is not None]
            if written:
                before[name], states[name] = written[-1][0], written[-1][1].state
        for name, at in before.items():
            self._written.setdefault(name, at)  # a skip keeps looking at the same run
        kept = []
        for occurrence in sorted(due, key=lambda o: o.at_ms):
            entry = occurrence.entry
            state = states.get(entry.name)
            if entry.overlap is Overlap.SKIP and state in (State.PENDING, State.RELEASED):
                continue
            if entry.overlap is Overlap.BUFFER_ONE and state is State.PENDING:
                continue
            kept.append(occurrence)
            if entry.name in looked:
                states[entry.name] = State.PENDING  # written now: it waits for its time
        return kept


def firer_of(app: Any, settings: Settings, store: ScheduleStore,
             write: Callable[[Sequence[Operation]], object], may_write: Callable[[int], bool],
             partitions: int, clock: Clock | None = None,
             changes_every_ms: int = CHANGES_EVERY_MS,
             certain: Callable[[int], bool] | None = None) -> Firer | None:
    """The firer of *app*'s periodic entries, with ``scheduler_periodic`` on (else None).

    :class:`PeriodicEntryError` names an entry that cannot be run as given, or whose task is
    not a scheduled task here (see :func:`celery_scheduler.periodic_tasks.install`)."""
    if not settings.periodic:
        return None
    entries = app_entries(app)
    scheduled = registry.tasks(app)
    for entry in entries:
        if entry.task not in scheduled:
            raise PeriodicEntryError(entry.name, (
                f"task {entry.task!r} is not a scheduled task in this process; call "
                "celery_scheduler.periodic_tasks.install(app) where the app is made (it makes the "
                "tasks of beat_schedule scheduled tasks in every process, workers included), "
                "or decorate the task with @scheduled_task"))
    if not entries:
        logger.warning("scheduler_periodic is on but the app's beat_schedule has no entries")
    else:
        logger.info("firing %d periodic entr%s: %s", len(entries), "y" if len(entries) == 1 else "ies",
                    ", ".join(sorted(e.name for e in entries)))
    plan = Firing(entries, lambda ordering_id: partition_for(ordering_id, partitions),
                  app.timezone, int(settings.periodic_ahead_seconds * 1000))

    def retry_of(task: str) -> RetryPolicy:
        found = registry.get(task)
        policy = found.retry_policy if found is not None else None
        return policy or settings.retry_policy

    return Firer(plan, store, write, may_write, retry_of, clock, code=entries,
                 known_tasks=lambda: registry.names(app), changes_every_ms=changes_every_ms,
                 certain=certain)
