"""Leases that end without an outcome: a released task whose outcome has not come is asked
about in the store once its lease ends, then released again: at once and with the same
attempt if it never started, as a failed attempt if its worker went silent (see
:mod:`celery_scheduler.heartbeat` for when a lease has ended, and
:func:`~celery_scheduler.dispatcher.rules.when_lease_ended`). A task a previous owner
released is asked about soon after it is loaded: its outcome may be stored already.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from celery_scheduler.dispatcher import rules
from celery_scheduler.dispatcher.beats import Beats
from celery_scheduler.dispatcher.state import EngineSettings
from celery_scheduler.dispatcher.timetable import Loaded, Timetable
from celery_scheduler.keys import TaskKey
from celery_scheduler.store.base import ScheduleStore, State, TaskStatus

__all__ = ["ALL_READ", "Expiry", "Settling", "say_released_again"]

logger = logging.getLogger("celery_scheduler.dispatcher.engine")  # its lines are the engine's

# What outcomes_read_until says when outcomes reach the engine as they are reported.
ALL_READ = 2**63 - 1
# How long a task whose lease ended waits before it is judged again (ms), while outcomes
# reported before the end may still be unread.
OUTCOME_WAIT_MS = 1000
# Why a task whose worker went silent is released again (its status's last error).
WORKER_LOST = "no beat from its worker within the run lease (the worker died or lost Kafka)"
# Tasks named in the one WARNING line that says which were released again in one pass (each
# has an INFO line of its own, with its key, for a search of one task's history).
NAMED_IN_WARNING = 3
NOT_STARTED = "did not start within their start lease"
SILENT = "had no beat from their worker within their run lease"


def say_released_again(keys: list[TaskKey], why: str) -> None:
    """Say in one WARNING line that *keys* were released again, and *why*: a broker that
    lost a step's releases, or a worker that died with its prefetched tasks, is one event,
    not one line a task."""
    if not keys:
        return
    named = ", ".join(str(key) for key in keys[:NAMED_IN_WARNING])
    more = f" and {len(keys) - NAMED_IN_WARNING} more" if len(keys) > NAMED_IN_WARNING else ""
    logger.warning("%d task(s) %s; releasing them again: %s%s", len(keys), why, named, more)


@dataclass
class Settling:
    """What an expiry is given of the settler (settling.py): what it reads, and the calls
    that apply what it decides."""

    store: ScheduleStore
    settings: EngineSettings
    clock: Callable[[], int]
    timetable: Timetable
    beats: Beats
    apply_outcome: Callable[[Loaded, bool, str | None], None]
    drop: Callable[[TaskKey], None]
    max_attempts: Callable[[Loaded], int]
    succeeding: Callable[[TaskKey], bool]  # succeeded, not yet recorded


class Expiry:
    """Judges released tasks whose outcome has not come, with what *settler* gives it."""

    def __init__(self, settler: Settling) -> None:
        self.settler = settler
        self.store, self.settings, self.clock = settler.store, settler.settings, settler.clock
        self.timetable, self.beats = settler.timetable, settler.beats
        # Per partition, the time (ms) before which every outcome reported has been read: a
        # lease is taken to have ended without an outcome only once that time is past its end.
        # Outcomes handed over directly (as in memory) are all read at once.
        self.outcomes_read_until: Callable[[int], int] = lambda partition: ALL_READ
        self._last_poll_ms = 0

    def unsettled(self, tasks: list[Loaded], open_: dict[TaskKey, Loaded]) -> list[Loaded]:
        """*tasks* less those released earlier whose outcome the store has (settled here).

        The statuses of all of them are read in one go: after a takeover, every ordering id
        may start with a task its previous owner released.
        """
        earlier = [task for task in tasks if task.awaiting_outcome]
        if not earlier:
            return tasks
        now = self.clock()
        unread = {task.key for task in earlier
                  if self.beats.release_end(task) > now or not self._outcome_read(task)}
        if unread:  # still running, or their outcomes may be in the topic, unread
            for key in unread:
                self.timetable.defer(key, max(now + OUTCOME_WAIT_MS, self.beats.release_end(open_[key])))
                del open_[key]
            earlier = [task for task in earlier if task.key not in unread]
            tasks = [task for task in tasks if task.key not in unread]
            if not earlier:
                return tasks
        statuses = self.store.statuses([task.key for task in earlier])
        settled = set()
        not_started: list[TaskKey] = []
        for task, status in zip(earlier, statuses, strict=True):
            if self._settle_from_store(task, status, not_started):
                settled.add(task.key)
                del open_[task.key]
        say_released_again(not_started, NOT_STARTED)
        return [task for task in tasks if task.key not in settled]

    def _outcome_stored(self, task: Loaded, status: TaskStatus | None) -> bool:
        """Apply the outcome the worker stored for *task*'s current attempt, if there is one."""
        outcome = rules.stored_outcome(status, task.attempts, task.lease_until_ms)
        if outcome is None:
            return False
        assert status is not None
        task.started_ms, task.finished_ms = status.started_ms, status.finished_ms
        self.settler.apply_outcome(task, *outcome)
        return True

    def _settle_from_store(self, task: Loaded, status: TaskStatus | None,
                           not_started: list[TaskKey]) -> bool:
        """A task released earlier whose lease ran out: did its outcome reach the store?

        If not, it is released again: with the same attempt if it was never heard running
        (it did not start: its key is added to *not_started*), as its next attempt if its
        worker went silent.
        """
        if self._outcome_stored(task, status):
            return True
        if rules.ended_elsewhere(status):
            self.settler.drop(task.key)
            return True
        if not task.heard_ms:
            logger.info("%s (attempt %d) did not start within its start lease; releasing it "
                        "again", task.key, task.attempts)
            not_started.append(task.key)
            task.attempts, task.lease_until_ms = task.attempts - 1, 0
            return False
        if task.attempts >= self.settler.max_attempts(task):
            self.settler.apply_outcome(task, False, WORKER_LOST)
            return True
        return False

    def poll(self) -> None:
        """Ask the store about released tasks whose outcome has not come.

        Outcomes come from the outcomes topic, so a task this engine released is asked about
        only when its lease ends (then released again if none was stored). A task a previous
        owner released may have had its outcome stored by that owner, or read again here
        before the task was loaded: it is asked about once soon after loading, and again when
        its lease ends.
        """
        now = self.clock()
        if now - self._last_poll_ms < min(500, self.settings.outcome_poll_seconds * 1000):
            return
        self._last_poll_ms = now
        first = int(self.settings.outcome_poll_seconds * 1000)
        asking: list[Loaded] = []
        for task in self.timetable.awaiting():
            if self.settler.succeeding(task.key):
                continue
            if task.next_poll_ms == 0:
                task.next_poll_ms = self.beats.release_end(task) if task.released_ms else now + first
            if now < task.next_poll_ms:
                continue
            end = self.beats.release_end(task)
            if task.released_ms and end > now:  # heard running since: not ended yet
                task.next_poll_ms = end
                continue
            task.next_poll_ms = end if end > now else now + first
            asking.append(task)
        released_again: dict[str, list[TaskKey]] = {NOT_STARTED: [], SILENT: []}
        try:
            for start in range(0, len(asking), self.settings.release_batch):
                chunk = asking[start:start + self.settings.release_batch]
                for task, status in zip(chunk, self.store.statuses([t.key for t in chunk]),
                                        strict=True):
                    self._settle_polled(task, status, now, released_again)
        finally:  # a later chunk's read may fail: what earlier ones released again is said
            for why, keys in released_again.items():
                say_released_again(keys, why)

    def _outcome_read(self, task: Loaded) -> bool:
        """Whether every outcome and beat reported before *task*'s lease ended has been read."""
        return self.outcomes_read_until(task.partition) >= self.beats.release_end(task)

    def _settle_polled(self, task: Loaded, status: TaskStatus | None, now: int,
                       released_again: dict[str, list[TaskKey]]) -> None:
        if self._outcome_stored(task, status):
            return
        if status is not None and status.state is State.CANCELLED:
            # A cancel overwritten by this release's marking, settled since by a reader of
            # the row it left (see settled_state): a released key is never cancelled
            # otherwise. Releasing it again would run a task reported as cancelled.
            logger.info("%s was settled as cancelled while released; dropping it", task.key)
            self.settler.drop(task.key)
            return
        if not task.released_ms:
            return
        end = self.beats.release_end(task)
        ended = rules.when_lease_ended(now, end, bool(task.heard_ms), self._outcome_read(task))
        if ended is rules.LeaseEnd.RUNNING:
            if now >= end:
                task.next_poll_ms = now + OUTCOME_WAIT_MS  # its outcome may be in the topic, unread
            return
        if ended is rules.LeaseEnd.NOT_STARTED:
            self._not_started(task, now)
            released_again[NOT_STARTED].append(task.key)
            return
        logger.info("no beat from the worker of %s (attempt %d) within its %.0fs run "
                    "lease; releasing it again", task.key, task.attempts, task.run_lease_ms / 1000)
        released_again[SILENT].append(task.key)
        self.settler.apply_outcome(task, False, WORKER_LOST)

    def _not_started(self, task: Loaded, now: int) -> None:
        """*task*'s release certainly did not start: release it again at once, the same
        attempt (a copy of the old release that turns up later is stale)."""
        logger.info("%s (attempt %d) did not start within its start lease; releasing it "
                    "again", task.key, task.attempts)
        task.attempts -= 1
        task.released_ms = task.next_poll_ms = task.heard_ms = 0
        self.timetable.retry_later(task.key, now)
