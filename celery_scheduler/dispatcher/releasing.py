"""The engine's release step: take what is due, mark it released, send it.

Tasks due (or within ``scheduler_release_ahead_seconds`` of it) are taken from the
timetable as far as the flow-control window allows, at most one in flight per ordering id.
A task past its deadline (its ``expires``) is marked expired instead, freeing its ordering
id. Each is released only while its partition's lease is certain, once its partition's ingest
has read every record acknowledged before it could first be marked (so that a cancel made
before then wins), once an earlier release of it has been settled, and not while the ingest
loop decides its key. A task whose partition's ingest has not read that far is looked at
again 50 ms later, still ahead of its due time; while its take's first task is not yet due
within ``gate_hold_ms``, the rest of the take waits with it, so that the take is marked
together rather than a few tasks at each step the ingest makes. The lot is marked released
in one round trip (with the successes due to be stored), and only then sent: by the on-time
sender at each one's due time, or at once. What the broker certainly did not take is put
back; what it may have taken stays released until its outcome or the end of its lease.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from celery_scheduler.calls import deadline_ms
from celery_scheduler.dispatcher.caught_up import CaughtUp
from celery_scheduler.dispatcher.claims import Claims
from celery_scheduler.dispatcher.leases import Leases
from celery_scheduler.dispatcher.ontime import OnTimeSender
from celery_scheduler.dispatcher.pace import Switching, Window
from celery_scheduler.dispatcher.settling import Settler
from celery_scheduler.dispatcher.state import EngineSettings, Partition, PublishMany, Sending
from celery_scheduler.dispatcher.timetable import Loaded, Timetable
from celery_scheduler.errors import ReleaseNotSentError
from celery_scheduler.keys import TaskKey
from celery_scheduler.metrics import Metrics
from celery_scheduler.store.base import ScheduleStore, State
from celery_scheduler.wire import Release

__all__ = ["GATE_RETRY_MS", "Releaser"]

logger = logging.getLogger("celery_scheduler.dispatcher.engine")  # its lines are the engine's

# A task held until its partition's ingest has caught up is looked at again this soon (ms);
# one held for longer than GATE_WARN_MS past its earliest marking is logged, at most every
# GATE_WARN_EVERY_MS.
GATE_RETRY_MS = 50
GATE_WARN_MS = 5_000
GATE_WARN_EVERY_MS = 30_000


class Releaser:
    """The release step of an engine; called from the engine's thread only."""

    def __init__(self, store: ScheduleStore, settings: EngineSettings, clock: Callable[[], int],
                 timetable: Timetable, partitions: dict[int, Partition], leases: Leases,
                 settler: Settler, claims: Claims, window: Window, switching: Switching,
                 metrics: Metrics, publish_many: PublishMany, sends_early: Callable[[Loaded], bool],
                 sender: OnTimeSender | None, ahead_ms: int) -> None:
        self.store = store
        self.settings = settings
        self.clock = clock
        self.timetable = timetable
        self.partitions = partitions
        self.leases = leases
        self.settler = settler
        self.claims = claims
        self.window = window
        self.switching = switching
        self.metrics = metrics
        self.publish_many = publish_many
        self.sends_early = sends_early
        self.sender = sender
        # a release's start lease, and a running task's run lease (see celery_scheduler.heartbeat)
        self.start_lease_ms = int(settings.start_lease_seconds * 1000)
        self.run_lease_ms = int(settings.lease_seconds * 1000)
        # Releases marked ahead of their due time are sent by a thread of their own (ontime.py).
        # Marking starts once the first task is this close to its due time, and takes every
        # task due within ahead_ms: the marks of a fifth of a second of due times share
        # requests, instead of each step marking the few that came into reach since the last.
        self.ahead_ms = ahead_ms
        self.mark_lead_ms = ahead_ms * 3 // 5
        # A take some of whose tasks wait for the ingest (below) waits with them while its
        # first task is due more than this ahead.
        self.gate_hold_ms = ahead_ms * 3 // 10
        # What the ingest loop has shown it has applied, per partition (caught_up.py): a task
        # is marked released only once every record acknowledged before its earliest marking
        # time is applied, so that a cancel made before then wins. None: records are applied
        # before the engine hears of them (as in memory).
        self.caught_up: CaughtUp | None = None
        self._gate_logged_ms = 0
        self.released_count = 0

    def next_take_ms(self) -> int | None:
        """When the next task may be taken for release (None: nothing waits)."""
        return self.timetable.next_take_ms(self.mark_lead_ms)

    def release_due(self) -> None:
        """Release what is due, as far as the window allows: mark, then send."""
        now = self.clock()
        # Successes due to be recorded go in the releases' write (see _release_taken) and
        # leave the window with it: counted as in flight here, a full window would write
        # them alone first and release in a second request.
        room = self.window.size() - self.timetable.in_flight_count() + self.settler.succeeded_due_count()
        if room <= 0:
            return
        next_take = self.timetable.next_take_ms(self.mark_lead_ms)
        if next_take is None or next_take > now:
            self.switching.released(None)
            return
        taken = self.timetable.take_due(now, min(room, self.settings.release_batch), self.ahead_ms)
        if not taken:
            return
        self.switching.released(now - min(task.due_ms for task in taken))
        # Every task taken is now in flight: whatever fails below, the ones not released,
        # put off or settled go back to their ordering id's queue, or it would stay blocked.
        open_ = {task.key: task for task in taken}
        try:
            self._release_taken(open_, now)
        finally:
            for task in open_.values():
                if self.timetable.is_in_flight(task.key):
                    self.timetable.defer(task.key, now + 1000)

    def _release_taken(self, open_: dict[TaskKey, Loaded], now: int) -> None:
        ready: list[Loaded] = []
        gated = False
        for task in list(open_.values()):
            partition = self.partitions.get(task.partition)
            if partition is None or not self.leases.may_release(partition):
                self.timetable.defer(task.key, now + 200)  # lease not (yet) certain
                del open_[task.key]
                continue
            if not self._ingested_before(task, now):
                self.timetable.look_again(task.key, now + GATE_RETRY_MS)
                del open_[task.key]
                gated = True
                continue
            ready.append(task)
        if gated and ready and min(task.due_ms for task in ready) - now > self.gate_hold_ms:
            # The ingest has not read as far as the later tasks of this take need: the take
            # waits for them while its first task can, and is marked in one request, not a
            # request for each step the ingest makes (see caught_up.py).
            for task in ready:
                self.timetable.look_again(task.key, now + GATE_RETRY_MS)
                del open_[task.key]
            return
        ready = self.settler.expiry.unsettled(ready, open_)
        if not ready:
            return
        # Keys the ingest loop is putting or cancelling right now are decided once it is done.
        free = self.claims.take_for_release(task.key for task in ready)
        for task in ready:
            if task.key not in free:
                self.timetable.defer(task.key, now + 200)
                del open_[task.key]
        ready = [task for task in ready if task.key in free]
        due = {task.key: task.due_ms for task in ready}
        lease_ms = self.start_lease_ms
        # Successes due to be recorded share the round trip: one wait for both. Their
        # ordering ids stay held until then, so none of them has a task among these.
        finishing = self.settler.succeeded_due()
        try:
            ready = self._expire_late(ready, open_, now)
            if ready or finishing:
                # Mark them all released (one round trip for the lot), and only then publish:
                # a task another dispatcher could see as not released must not be running.
                # One marked ahead is sent at its due time: its start lease counts from then.
                self.store.mark_released_and_succeeded(
                    [(t.stored, t.attempts + 1, max(now, due[t.key]) + lease_ms) for t in ready],
                    [t.stored for t in finishing], now, {t.key: t.run for t in finishing})
        finally:
            self.claims.marked(free)
        if finishing:
            self.settler.succeeded_stored(finishing)
        if ready:
            self._send_marked(ready, open_, due, now)

    def _expire_late(self, ready: list[Loaded], open_: dict[TaskKey, Loaded], now: int) -> list[Loaded]:
        """*ready* less the tasks past their deadline (``expires``), which are marked expired
        instead of released: each frees its ordering id, and none runs late."""
        late = [task for task in ready if task.envelope.options
                and (deadline := deadline_ms(task.key.scheduled_ms, task.envelope.options)) is not None
                and now > deadline]
        if not late:
            return ready
        self.store.finish_many([task.stored for task in late], State.EXPIRED, now,
                               {task.key: task.run for task in late})
        first = late[0]
        logger.warning("%d task(s) expired before they could be released, first %s (due %.1fs "
                       "ago, expires=%gs)", len(late), first.key,
                       (now - first.key.scheduled_ms) / 1000, first.envelope.options["expires"])
        for task in late:
            del open_[task.key]
            self.settler.drop(task.key)
            self.metrics.finished("expired")
        gone = {task.key for task in late}
        return [task for task in ready if task.key not in gone]

    def _ingested_before(self, task: Loaded, now: int) -> bool:
        """Whether every record of *task*'s partition acknowledged before the task could
        first be marked released (its scheduled time less the release-ahead) has been applied."""
        if self.caught_up is None:
            return True
        since = task.key.scheduled_ms - self.ahead_ms
        if self.caught_up.covers(task.partition, since, now, task.key):
            return True
        if now - since > GATE_WARN_MS and now - self._gate_logged_ms > GATE_WARN_EVERY_MS:
            self._gate_logged_ms = now
            if self.caught_up.carried(task.partition, task.key):
                logger.warning("holding %s (due %.1fs ago) until the ingest loop has written the "
                               "records of its ordering id it has read (one a round): a cancel of "
                               "it, or an earlier task, may be among them", task.key,
                               (now - task.due_ms) / 1000)
            else:
                logger.warning("holding %s (due %.1fs ago) until the ingest loop has read partition "
                               "%d as far as Kafka holds: a cancel of it may still be unread",
                               task.key, (now - task.due_ms) / 1000, task.partition)
        return False

    def _send_marked(self, ready: list[Loaded], open_: dict[TaskKey, Loaded], due: dict[TaskKey, int],
                     now: int) -> None:
        """Publish *ready*, just marked released, each at its *due* time or now if that passed."""
        sending: list[Sending] = []
        lease_ms = self.start_lease_ms
        for task in ready:
            del open_[task.key]
            partition = self.partitions.get(task.partition)
            if partition is None or not self.leases.may_release(partition):  # the marking took long
                self.timetable.defer(task.key, now + 200)
                continue
            assert partition.lease is not None
            attempt, at = task.attempts + 1, max(now, due[task.key])
            task.attempts, task.lease_until_ms, task.released_ms = attempt, at + lease_ms, at
            if attempt == 1 and not task.first_released_ms:  # kept by a release sent again
                task.first_released_ms = at
            task.next_poll_ms, task.heard_ms, task.beat_offset = 0, 0, -1
            release = Release(task.key, task.partition, attempt, partition.lease.epoch, at + lease_ms,
                              due[task.key], self.run_lease_ms, now)
            sending.append(Sending(task, release, due[task.key], self.sends_early(task)))
        if not sending:
            return
        if self.sender is not None:
            self.sender.hand(sending)  # sent on time; Sent comes back as an event
            return
        results = self.publish_many([(item.task, item.release) for item in sending])
        self.sent(list(zip(sending, results, strict=True)), now)

    def sent(self, results: list[tuple[Sending, Exception | None]], sent_ms: int) -> None:
        """Count what was sent; put back what certainly was not."""
        failed: list[tuple[Loaded, Exception]] = []
        uncertain: list[tuple[Loaded, Exception]] = []
        for item, error in results:
            task, release = item.task, item.release
            if isinstance(error, ReleaseNotSentError):
                # only while it is still this release in flight here (its partition may
                # have been revoked meanwhile: its next owner decides)
                if (self.timetable.get(task.key) is task and self.timetable.is_in_flight(task.key)
                        and task.attempts == release.attempt):
                    failed.append((task, error))
                continue
            if error is not None:
                uncertain.append((task, error))
            self.released_count += 1
            self.metrics.released((sent_ms - item.due_ms) / 1000 if release.attempt == 1 else 0.0)
        if uncertain:
            # Sending it again now could make two copies of one release that run at once,
            # or run beside the next task of the ordering id once the first copy reports: it
            # stays released, and its outcome or the end of its lease decides, as for any.
            logger.warning("%d release(s) may have reached the broker, first %s (%s); waiting "
                           "for their outcome or the end of their lease", len(uncertain),
                           uncertain[0][0].key, uncertain[0][1])
        if failed:
            self._unpublished(failed, sent_ms)

    def _unpublished(self, failed: list[tuple[Loaded, Exception]], now: int) -> None:
        """The broker certainly did not take *failed*: undo, and try again in a second.

        The attempt is not spent: no message of it exists.
        """
        logger.warning("could not publish %d task(s) to Celery, first %s (%s); retrying in 1s",
                       len(failed), failed[0][0].key, failed[0][1])
        for task, _ in failed:  # memory first: the store may be down too
            task.attempts, task.released_ms = task.attempts - 1, 0
            if task.attempts == 0:
                task.first_released_ms = 0
            self.timetable.retry_later(task.key, now + 1000)
        for task, error in failed:
            self.store.mark_retry(task.stored, task.attempts, now + 1000, f"broker: {error}", now)
