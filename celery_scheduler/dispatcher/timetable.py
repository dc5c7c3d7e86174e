"""The dispatcher's in-memory view of what is loaded: one queue per ordering id.

Only a bounded window of the schedule is ever here (the loader decides what). The timetable
enforces the ordering rule: per ordering id, the head task (earliest scheduled time) is
released only when nothing of that ordering id is in flight, so tasks of one ordering id
never overlap and run in schedule order, while any number of ordering ids run side by side.
A head the operators' pauses hold (:attr:`Timetable.held`) is not taken: its ordering id
waits, in order, until :meth:`Timetable.hold_by` lifts the pause. A head of a rate-limited
task name or ordering id is taken at the slot :attr:`Timetable.limiter` books for it: one
booked later than now waits in the heap until then (see ``limits``).
It does no I/O and is used from a single thread.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

from celery_scheduler.dispatcher.limits import Limiter
from celery_scheduler.dispatcher.pausing import NOTHING, Held
from celery_scheduler.envelope import ScheduleEnvelope
from celery_scheduler.keys import TaskKey
from celery_scheduler.store.base import RateLimit, RunTimes, StoredTask

__all__ = ["Loaded", "Timetable"]


@dataclass(eq=False)
class Loaded:
    """A task loaded into memory, with its dispatch state from the store."""

    partition: int
    envelope: ScheduleEnvelope
    attempts: int = 0  # releases so far
    not_before_ms: int = 0  # retry backoff: not released before this time
    # released earlier and not finished: blocked until then. Set only when loaded or while
    # taken in flight: Timetable.awaiting() looks at no other task.
    lease_until_ms: int = 0
    blocked: bool = False  # retries exhausted under the "block" policy
    bucket: int = 0  # where its row is stored
    released_ms: int = 0  # when it was last released (0: not by this process)
    next_poll_ms: int = 0  # when to ask the store about its outcome next
    # When its current release was last heard running (a beat; 0: not heard), and the offset
    # of that beat in the outcomes topic (not committed past while it runs).
    heard_ms: int = 0
    beat_offset: int = -1
    run_lease_ms: int = 0  # the run lease its beats say its worker keeps
    # What its status records when it finishes (0: unknown): its first release, if this
    # process made it, and its last attempt's start and end, as the worker reported them.
    first_released_ms: int = 0
    started_ms: int = 0
    finished_ms: int = 0
    # the later slot a rate limit booked for its next release (0: none), until it is back
    # from flight: sent at it (its due time), as any release marked ahead
    slot_ms: int = 0

    @property
    def key(self) -> TaskKey:
        return self.envelope.key

    @property
    def awaiting_outcome(self) -> bool:
        """Released before and not yet reported: its outcome may already be in the store."""
        return self.lease_until_ms > 0

    @property
    def stored(self) -> StoredTask:
        return StoredTask(self.partition, self.bucket, self.envelope, self.attempts,
                          self.not_before_ms, self.lease_until_ms, self.blocked)

    @property
    def run(self) -> RunTimes:
        return RunTimes(self.first_released_ms, self.started_ms, self.finished_ms)

    @property
    def due_ms(self) -> int:
        return max(self.envelope.key.scheduled_ms, self.not_before_ms, self.lease_until_ms,
                   self.slot_ms)

    @property
    def order(self) -> tuple[int, str]:
        return (self.envelope.key.scheduled_ms, self.envelope.key.uniqueness_key)


@dataclass(eq=False)
class _Queue:
    partition: int
    tasks: list[tuple[tuple[int, str], Loaded]] = field(default_factory=list)
    in_flight: Loaded | None = None

    def head(self) -> Loaded | None:
        return self.tasks[0][1] if self.tasks else None


class Timetable:
    """Loaded tasks by ordering id; tells which are due and releasable."""

    def __init__(self) -> None:
        self._queues: dict[str, _Queue] = {}
        self._by_key: dict[TaskKey, Loaded] = {}
        self._per_partition: dict[int, int] = {}
        self._heap: list[tuple[int, int, str]] = []  # (due_ms, tie, ordering id), lazily pruned
        # Entries taken by no look ahead of their due time: heads whose earlier copy is still
        # leased, and tasks put off. They wait here until due, so that a step looking ahead
        # does not find them again and again.
        self._parked: list[tuple[int, int, str]] = []
        # Heads put back to be looked at again at a time (look_again), ahead of their due
        # time as any head: (time, tie, ordering id), back in the heap from that time.
        self._waking: list[tuple[int, int, str]] = []
        self._tie = itertools.count()
        self._in_flight = 0  # queues with a task in flight
        # Every task that may await an outcome (loaded with a lease, or taken in flight since
        # it was loaded), so that awaiting() need not look at every loaded task; those whose
        # lease was cleared since leave it when it is next read.
        self._leased: dict[TaskKey, Loaded] = {}
        # What the operators' pauses hold, and the ordering ids whose head they held: out of
        # the heap until hold_by() changes what is held.
        self.held: Held = NOTHING
        self._held_ids: set[str] = set()
        self.limiter = Limiter()  # the operators' rate limits

    def __len__(self) -> int:
        return len(self._by_key)

    def __contains__(self, key: TaskKey) -> bool:
        return key in self._by_key

    def in_flight_count(self) -> int:
        """How many tasks are in flight (taken for release and not yet back or finished)."""
        return self._in_flight

    def count(self, partition: int) -> int:
        """How many tasks of *partition* are loaded."""
        return self._per_partition.get(partition, 0)

    def get(self, key: TaskKey) -> Loaded | None:
        return self._by_key.get(key)

    def loaded_of(self, ordering_id: str) -> int:
        """How many tasks of *ordering_id* are loaded (the one in flight included)."""
        queue = self._queues.get(ordering_id)
        return len(queue.tasks) if queue is not None else 0

    def last_order(self, ordering_id: str) -> tuple[int, str] | None:
        """The place of the loaded task of *ordering_id* that comes last (in flight or not)."""
        queue = self._queues.get(ordering_id)
        return queue.tasks[-1][0] if queue is not None and queue.tasks else None

    def last_of(self, ordering_id: str) -> Loaded | None:
        """The loaded task of *ordering_id* that comes last, if it is not in flight."""
        queue = self._queues.get(ordering_id)
        if queue is None or not queue.tasks or queue.tasks[-1][1] is queue.in_flight:
            return None
        return queue.tasks[-1][1]

    def add(self, task: Loaded) -> bool:
        """Load *task*; a task with the same key is replaced unless it is in flight."""
        key = task.key
        queue = self._queues.get(key.ordering_id)
        if queue is None:
            queue = self._queues[key.ordering_id] = _Queue(task.partition)
        existing = self._by_key.get(key)
        if existing is not None:
            if queue.in_flight is existing:
                return False
            self._unlink(queue, existing)
        bisect.insort(queue.tasks, (task.order, task), key=lambda item: item[0])
        self._by_key[key] = task
        if task.lease_until_ms > 0:
            self._leased[key] = task
        self._per_partition[task.partition] = self._per_partition.get(task.partition, 0) + 1
        self._schedule(key.ordering_id, queue)
        return True

    def remove(self, key: TaskKey) -> Loaded | None:
        """Forget *key* (cancelled or finished); frees its ordering id if it was in flight."""
        task = self._by_key.get(key)
        if task is None:
            return None
        queue = self._queues[key.ordering_id]
        self._land(queue, task)
        self._unlink(queue, task)
        if not queue.tasks and queue.in_flight is None:
            del self._queues[key.ordering_id]
        else:
            self._schedule(key.ordering_id, queue)
        return task

    def _land(self, queue: _Queue, task: Loaded) -> None:
        """*task* is no longer in flight (if it was)."""
        if queue.in_flight is task:
            queue.in_flight = None
            self._in_flight -= 1
            task.slot_ms = 0  # its slot was used: another release books another

    def _unlink(self, queue: _Queue, task: Loaded) -> None:
        index = next(i for i, (_, t) in enumerate(queue.tasks) if t is task)
        del queue.tasks[index]
        del self._by_key[task.key]
        self._leased.pop(task.key, None)
        self._per_partition[task.partition] -= 1

    def _schedule(self, ordering_id: str, queue: _Queue, park: bool = False) -> None:
        head = queue.head()
        if head is not None and queue.in_flight is None and not head.blocked:
            heapq.heappush(self._parked if park else self._heap,
                           (head.due_ms, next(self._tie), ordering_id))

    def take_due(self, now_ms: int, limit: int | None = None, ahead_ms: int = 0) -> list[Loaded]:
        """Return the releasable tasks due by *now_ms* (one per ordering id), marked in flight.

        With *ahead_ms*, also those due within that much after *now_ms*, except a task whose
        earlier release's lease has not ended (it is due only once that copy can no longer
        be running) and a task put off (``defer``) until a time not yet come.
        """
        while self._parked and self._parked[0][0] <= now_ms:
            heapq.heappush(self._heap, heapq.heappop(self._parked))
        while self._waking and self._waking[0][0] <= now_ms:
            _, tie, ordering_id = heapq.heappop(self._waking)
            queue = self._queues.get(ordering_id)
            head = queue.head() if queue is not None else None
            if head is not None:  # its head now, at its due time (a stale one is passed over)
                heapq.heappush(self._heap, (head.due_ms, tie, ordering_id))
        released: list[Loaded] = []
        limiter = self.limiter if self.limiter else None
        while self._heap and self._heap[0][0] <= now_ms + ahead_ms:
            entry = heapq.heappop(self._heap)
            due_ms, _, ordering_id = entry
            queue = self._queues.get(ordering_id)
            head = queue.head() if queue is not None else None
            if queue is None or head is None or queue.in_flight is not None or head.blocked:
                continue
            if head.due_ms != due_ms:  # stale entry; the current one is in the heap as well
                continue
            if self.held and self.held.holds(head.envelope.task, ordering_id):
                self._held_ids.add(ordering_id)
                continue
            if due_ms > now_ms and head.awaiting_outcome:
                heapq.heappush(self._parked, entry)
                continue
            if limiter is not None and not head.slot_ms:
                at = max(due_ms, now_ms)
                slot = limiter.book(head.envelope.task, ordering_id, at)
                if slot > at:  # back in the heap at its slot, taken (ahead) as any due head
                    head.slot_ms = slot
                    heapq.heappush(self._heap, (slot, next(self._tie), ordering_id))
                    continue
            queue.in_flight = head
            self._in_flight += 1
            self._leased[head.key] = head
            released.append(head)
            if limit is not None and len(released) >= limit:
                break
        return released

    def hold_by(self, held: Held) -> None:
        """From now on, hold what *held* holds; the heads held so far are looked at again
        (in due order, as ever: those still held are held again when taken)."""
        self.held = held
        released, self._held_ids = self._held_ids, set()
        for ordering_id in released:
            queue = self._queues.get(ordering_id)
            if queue is not None:
                self._schedule(ordering_id, queue)

    def limit_by(self, limits: Iterable[RateLimit], share: float) -> None:
        """From now on, release by *limits* at this dispatcher's *share*; the slots booked
        so far are booked again (a changed rate, or share, changes them)."""
        self.limiter.update(limits, share)
        for ordering_id, queue in self._queues.items():
            head = queue.head()
            if head is not None and head.slot_ms:
                head.slot_ms = 0
                self._schedule(ordering_id, queue)

    def held_count(self) -> int:
        """How many ordering ids a pause holds (their head was due and held)."""
        return len(self._held_ids)

    def next_due_ms(self) -> int | None:
        """The earliest due time of a releasable head (may be stale-early, never late)."""
        heads = [entries[0][0] for entries in (self._heap, self._parked, self._waking) if entries]
        return min(heads) if heads else None

    def next_take_ms(self, ahead_ms: int) -> int | None:
        """The earliest time a ``take_due(..., ahead_ms=ahead_ms)`` may return a task.

        A task put off, or a head whose earlier copy is leased, counts at its due time, not
        *ahead_ms* before it. May be early (stale entries), never late.
        """
        candidates = []
        if self._heap:
            candidates.append(self._heap[0][0] - ahead_ms)
        for waiting in (self._parked, self._waking):
            if waiting:
                candidates.append(waiting[0][0])
        return min(candidates) if candidates else None

    def in_flight(self) -> list[Loaded]:
        return [q.in_flight for q in self._queues.values() if q.in_flight is not None]

    def is_in_flight(self, key: TaskKey) -> bool:
        task = self._by_key.get(key)
        return task is not None and self._queues[key.ordering_id].in_flight is task

    def awaiting(self) -> list[Loaded]:
        """Tasks released (by us or a previous owner) whose outcome has not been seen."""
        cleared = [key for key, task in self._leased.items() if task.lease_until_ms <= 0]
        for key in cleared:
            del self._leased[key]
        return list(self._leased.values())

    def defer(self, key: TaskKey, until_ms: int) -> None:
        """Put the in-flight *key* back unchanged, to be looked at again at *until_ms*.

        Not sooner: a look ahead of the due time does not take it before then.
        """
        task = self._by_key[key]
        queue = self._queues[key.ordering_id]
        self._land(queue, task)
        task.not_before_ms = max(task.not_before_ms, until_ms)
        self._schedule(key.ordering_id, queue, park=True)

    def look_again(self, key: TaskKey, at_ms: int) -> None:
        """Put the in-flight *key* back unchanged, to be taken again from *at_ms*, and then
        ahead of its due time as any head (unlike :meth:`defer`, which keeps it until due)."""
        task = self._by_key[key]
        queue = self._queues[key.ordering_id]
        self._land(queue, task)
        head = queue.head()
        if head is not None and not head.blocked:
            heapq.heappush(self._waking, (at_ms, next(self._tie), key.ordering_id))

    def retry_later(self, key: TaskKey, not_before_ms: int) -> None:
        """Put the in-flight *key* back as the head of its ordering id, due at *not_before_ms*."""
        task = self._by_key[key]
        queue = self._queues[key.ordering_id]
        self._land(queue, task)
        task.not_before_ms = not_before_ms
        task.lease_until_ms = 0
        self._schedule(key.ordering_id, queue)

    def hold(self, key: TaskKey) -> None:
        """Count *key* in flight until it is removed, so nothing of its ordering id is released.

        For a task whose success is known but not yet stored: one released by a previous
        owner is not in flight here, and would otherwise be released again at its lease's end.
        """
        task = self._by_key[key]
        queue = self._queues[key.ordering_id]
        if queue.in_flight is None:
            queue.in_flight = task
            self._in_flight += 1
            self._leased[key] = task

    def block(self, key: TaskKey) -> None:
        """Hold *key*'s ordering id until the task is removed (an operator cancels it)."""
        task = self._by_key[key]
        task.blocked = True
        self._land(self._queues[key.ordering_id], task)

    def drop_partitions(self, partitions: Iterable[int]) -> int:
        """Forget everything of *partitions* (they were revoked); return how many tasks."""
        gone = set(partitions)
        dropped = 0
        for ordering_id in [o for o, q in self._queues.items() if q.partition in gone]:
            queue = self._queues.pop(ordering_id)
            if queue.in_flight is not None:
                self._in_flight -= 1
            self._held_ids.discard(ordering_id)
            for _, task in queue.tasks:
                del self._by_key[task.key]
                self._leased.pop(task.key, None)
                dropped += 1
        for partition in gone:
            self._per_partition.pop(partition, None)
        return dropped

    def successor_due_ms(self, key: TaskKey) -> int | None:
        """When the task after *key* in its ordering id is due; None if none is loaded."""
        queue = self._queues.get(key.ordering_id)
        if queue is None:
            return None
        for _, task in queue.tasks[:2]:
            if task.key is not key and task.key != key:  # mostly the key itself, in flight
                return task.due_ms
        return None

    def waiting_after(self, task: Loaded) -> list[Loaded]:
        """The loaded tasks of *task*'s ordering id that come after it and are not in flight."""
        queue = self._queues.get(task.key.ordering_id)
        if queue is None:
            return []
        return [t for order, t in queue.tasks if order > task.order and t is not queue.in_flight]

    def partition_tasks(self, partition: int) -> list[Loaded]:
        return [t for t in self._by_key.values() if t.partition == partition]
