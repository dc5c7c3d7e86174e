"""What a dispatcher hears of running tasks: the beats workers send while they run a release
(see :mod:`celery_scheduler.heartbeat`), and what follows from them.

A beat keeps a release's run lease: a task heard running is not released again until its
beats stop for the run lease. A beat of a task not loaded yet (read after a takeover,
before the loader reached the task) is kept until the task is. Outcome offsets are
committed no further than the latest beat of a task still running, so that a partition's
next owner reads that beat again (:meth:`Beats.floors`).
"""

from __future__ import annotations

from collections.abc import Callable

from celery_scheduler.dispatcher.state import Partition
from celery_scheduler.dispatcher.timetable import Loaded, Timetable
from celery_scheduler.heartbeat import heard_ms, not_started_by_ms, stopped_by_ms
from celery_scheduler.keys import TaskKey
from celery_scheduler.wire import Beat

__all__ = ["UNLOADED_BEATS", "Beats"]

# Beats of tasks not loaded (yet) are kept for when they are, up to this many.
UNLOADED_BEATS = 100_000


class Beats:
    """The beats an engine has read, by task; called from the engine's thread only."""

    def __init__(self, timetable: Timetable, partitions: dict[int, Partition],
                 clock: Callable[[], int]) -> None:
        self.timetable = timetable
        self.partitions = partitions
        self.clock = clock
        # beats of tasks not loaded (yet), with when they were read: applied when the task
        # is judged; and the tasks heard running, whose beats hold outcome commits back
        self.unloaded: dict[TaskKey, tuple[Beat, int]] = {}
        self.beating: dict[TaskKey, Loaded] = {}

    def forget_partitions(self, gone: set[int]) -> None:
        self.unloaded = {k: b for k, b in self.unloaded.items() if b[0].partition not in gone}

    def read(self, beat: Beat, now: int) -> None:
        """*beat*, read at *now*: applied to its task, or kept until the task is loaded."""
        task = self.timetable.get(beat.key)
        if task is not None:
            self.heard(task, beat, now)
        elif len(self.unloaded) < UNLOADED_BEATS:
            kept = self.unloaded.get(beat.key)
            if kept is None or kept[0].sent_ms <= beat.sent_ms:
                self.unloaded[beat.key] = (beat, now)

    def heard(self, task: Loaded, beat: Beat, read_ms: int) -> None:
        """*beat*, read at *read_ms*: *task*'s current release is running, if it is its."""
        if not (task.awaiting_outcome and beat.attempt == task.attempts
                and beat.generation == task.lease_until_ms):
            return  # an earlier release's, or one finished since
        task.heard_ms = max(task.heard_ms, heard_ms(beat, read_ms))
        task.run_lease_ms = beat.run_lease_ms
        task.beat_offset = max(task.beat_offset, beat.offset)
        task.started_ms = task.started_ms or beat.started_ms
        self.beating[task.key] = task

    def release_end(self, task: Loaded) -> int:
        """When *task*'s current release, unless an outcome comes, is certainly not running:
        its start lease's end if it was never heard, its last beat plus the run lease if it was."""
        kept = self.unloaded.pop(task.key, None)
        if kept is not None:
            self.heard(task, *kept)
        end = not_started_by_ms(task.lease_until_ms)
        if task.heard_ms:
            end = max(end, stopped_by_ms(task.heard_ms, task.run_lease_ms))
        return end

    def floors(self) -> dict[int, int]:
        """Per partition, the offset of the earliest latest-beat of a task still heard running
        (and forget the tasks no longer running)."""
        floors: dict[int, int] = {}
        for key, task in list(self.beating.items()):
            if self.timetable.get(key) is not task or not task.awaiting_outcome or not task.heard_ms:
                del self.beating[key]
                continue
            floors[task.partition] = min(task.beat_offset, floors.get(task.partition, task.beat_offset))
        if self.unloaded:
            now = self.clock()
            for key, (beat, read) in list(self.unloaded.items()):
                if (beat.partition not in self.partitions
                        or stopped_by_ms(heard_ms(beat, read), beat.run_lease_ms) < now):
                    del self.unloaded[key]
                    continue
                floors[beat.partition] = min(beat.offset, floors.get(beat.partition, beat.offset))
        return floors
