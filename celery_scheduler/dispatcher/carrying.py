"""What a batch writes now and what it carries to the next: a hot ordering id's records.

A batch writes its records in rounds, one record of an ordering id a round (rounds.py), and
each round waits for the one before. Ten thousand tasks of one ordering id scheduled in bulk
would make every batch that reads a thousand of them a thousand rounds long, and every other
record of the batch, of any ordering id, would wait for them. So a batch stops at
``MOST_ROUNDS``: the records of an ordering id past its last round are carried, decoded and
in the order read, to the next batch, which writes them before anything read after them.
They wait in a queue per ordering id, so that a batch looks at no more of them than it
writes: ten thousand carried cost a batch what a few rounds of them do.

Nothing is committed past a carried record: a partition's committed offset stays at its first
carried record until that record is written, and a restart or a new owner reads from there
again (every write is idempotent). A partition is shown caught up past its carried records
only together with what they hold back (see caught_up.py), until they are written: of an
ordering id with a carried cancel (or retry, move, or task named by its task id), nothing
is released, as the cancel must still win; of one with only plain schedule calls carried,
nothing that comes after the earliest of them.

A batch writes a carried ordering id's plain schedule calls a run of ``CARRIED_A_ROUND`` a
round (nothing the engine may release depends on one of them before all are written, as
they are held), at most ``CARRIED_A_BATCH`` of them. The ingest loop writes a batch of them
at a pace (``CARRY_PACE_SECONDS``, ingest.py), not as fast as it can: an ordering id runs
one task at a time, and ten thousand written in a few seconds would take the CPU and the
store's requests the other ordering ids' releases wait for. Once something waits for them,
a partition not read or a cancel holding its whole ordering id back, they go at once.

Carried records stay in memory: at most ``MOST_CARRIED_BATCHES`` batches of them. Past that,
the partitions that carry most are paused until half as many are carried, so memory stays
bounded whatever one ordering id holds.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from celery_scheduler.dispatcher.caught_up import CaughtUp
from celery_scheduler.dispatcher.lingering import plain_call
from celery_scheduler.dispatcher.rounds import MOST_ROUNDS, Rounds
from celery_scheduler.store.records import Operation, Put
from celery_scheduler.tasklog.base import Record

__all__ = ["MOST_CARRIED_BATCHES", "Batch", "Carrier", "Order", "plain_order"]

# its lines are the ingest loop's
logger = logging.getLogger("celery_scheduler.dispatcher.ingest")

# Records carried at most, in batches (scheduler_ingest_batch_size each).
MOST_CARRIED_BATCHES = 20
# Of an ordering id's records carried, a batch writes at most CARRIED_A_BATCH, its plain
# schedule calls up to CARRIED_A_ROUND together in a round.
CARRIED_A_ROUND = 64
CARRIED_A_BATCH = 64

# A task's place among its ordering id's: (scheduled time, uniqueness key).
Order = tuple[int, str]


def plain_order(operation: Operation) -> Order | None:
    """Where a carried *operation* starts holding its ordering id back: a plain schedule
    call, at its own task (it adds one before those after it); anything else, at the start
    (None): anything but a plain call (lingering.py)."""
    if not isinstance(operation, Put) or not plain_call(operation.envelope):
        return None
    key = operation.envelope.key
    return (key.scheduled_ms, key.uniqueness_key)


@dataclass(eq=False)
class _Queue:
    """One ordering id's carried records, in the order read."""

    partition: int
    items: collections.deque[tuple[int, Record, Operation]] = field(default_factory=collections.deque)
    # the plain schedule calls' places, by when they were carried: a heap whose entries of
    # records written since are dropped once they come to the top
    plain: list[tuple[Order, int]] = field(default_factory=list)
    blocking: int = 0  # the others carried (see plain_order)

    def append(self, seq: int, record: Record, operation: Operation) -> None:
        self.items.append((seq, record, operation))
        order = plain_order(operation)
        if order is None:
            self.blocking += 1
        else:
            heapq.heappush(self.plain, (order, seq))

    def pop_written(self, count: int) -> None:
        for _ in range(count):
            _, _, operation = self.items.popleft()
            if plain_order(operation) is None:
                self.blocking -= 1
        if len(self.plain) > 2 * len(self.items) + 16:  # written ones that never came to the top
            self._rebuild()

    def _rebuild(self) -> None:
        kept = {seq for seq, _, _ in self.items}
        self.plain = [entry for entry in self.plain if entry[1] in kept]
        heapq.heapify(self.plain)

    def drop_last(self, count: int) -> None:
        """The last *count* are read again (their batch failed): not carried."""
        for _ in range(count):
            self.items.pop()
        self.blocking = sum(1 for _, _, op in self.items if plain_order(op) is None)
        self._rebuild()

    def held_from(self) -> Order | None:
        """From where the records carried hold the ordering id's tasks back (None: all)."""
        if self.blocking:
            return None
        first = self.items[0][0]
        while self.plain and self.plain[0][1] < first:  # written since
            heapq.heappop(self.plain)
        return self.plain[0][0]


class Carrier:
    """The records carried from one batch to the next, by ordering id; what has been shown
    the engine held for them (through *caught_up*); and the partitions not read as they carry
    too much. It does no I/O: the ingest loop pauses and resumes what it says."""

    def __init__(self, caught_up: CaughtUp | None) -> None:
        self.caught_up = caught_up
        self.queues: dict[str, _Queue] = {}  # by ordering id, the first carried first
        self.count = 0
        self.paused: set[int] = set()
        self.carrying = False  # whether anything is carried (said when it changes)
        self._seq = 0
        self._holding: dict[int, dict[str, Order | None]] = {}  # what was shown held, by partition

    def __len__(self) -> int:
        return self.count

    def partitions(self) -> set[int]:
        return {queue.partition for queue in self.queues.values()}

    def waited_for(self) -> bool:
        """Whether something waits for the records carried, so that the next batch writes
        them whatever the pace: a partition not read as it carries too much, or a cancel
        (or retry, move, or task named by its task id) whose whole ordering id is held."""
        return bool(self.paused) or any(queue.blocking for queue in self.queues.values())

    def append(self, ordering_id: str, record: Record, operation: Operation) -> None:
        queue = self.queues.get(ordering_id)
        if queue is None:
            queue = self.queues[ordering_id] = _Queue(record.partition)
        self._seq += 1
        queue.append(self._seq, record, operation)
        self.count += 1

    def let_go(self, keep: Callable[[int], bool]) -> list[Record]:
        """Let the records carried of partitions not to *keep* go (they are read again from
        the committed offset, by this process or their new owner): the first of each
        ordering id's, for the partition to be read again from."""
        gone = [(oid, queue) for oid, queue in self.queues.items() if not keep(queue.partition)]
        for ordering_id, queue in gone:
            del self.queues[ordering_id]
            self.count -= len(queue.items)
        for partition in {queue.partition for _, queue in gone}:
            self._holding.pop(partition, None)
        self.paused = {partition for partition in self.paused if keep(partition)}
        return [queue.items[0][1] for _, queue in gone]

    def first_offsets(self) -> dict[int, int]:
        """Per partition carrying any, the offset of its first record carried."""
        first: dict[int, int] = {}
        for queue in self.queues.values():
            offset = queue.items[0][1].offset
            if offset < first.get(queue.partition, offset + 1):
                first[queue.partition] = offset
        return first

    def written(self, batch: Batch, most: int) -> tuple[list[int], list[int]]:
        """*batch* was written: what it took of the records carried is no longer carried,
        and what it appended is. Shows the engine what the records carried hold back (before
        it is shown the partitions applied past them). The partitions to pause, as they carry
        too much, and to resume, as half as much is carried."""
        for ordering_id, count in batch.taken.items():
            self._shrink(ordering_id, count, _Queue.pop_written)
        if self.carrying != bool(self.queues):
            self.carrying = bool(self.queues)
            logger.info("%s", f"carrying {self.count} records of hot ordering ids to later "
                        f"batches ({batch.rounds.most} rounds a batch)" if self.carrying else
                        "the records carried to later batches are all written")
        self.show_held()
        counts = self._counts()
        # a partition paused is read again once it carries its share of half the most
        resume = sorted(p for p in self.paused
                        if counts.get(p, 0) <= most // 2 // len(self.paused))
        self.paused.difference_update(resume)
        pause = [p for p in self._most_carrying(counts, most) if p not in self.paused]
        self.paused.update(pause)
        return pause, resume

    def failed(self, batch: Batch) -> None:
        """*batch* failed: what it took stays carried, and what it read is read again."""
        for ordering_id, count in batch.appended.items():
            self._shrink(ordering_id, count, _Queue.drop_last)

    def _shrink(self, ordering_id: str, count: int, how: Callable[[_Queue, int], None]) -> None:
        """Take *count* records off *ordering_id*'s queue, *how* says from which end."""
        queue = self.queues[ordering_id]
        how(queue, count)
        self.count -= count
        if not queue.items:
            del self.queues[ordering_id]

    def show_held(self) -> None:
        """Show the engine what the records carried hold back (see the module)."""
        if self.caught_up is None:
            return
        holds: dict[int, dict[str, Order | None]] = {}
        for ordering_id, queue in self.queues.items():
            holds.setdefault(queue.partition, {})[ordering_id] = queue.held_from()
        # every batch, changed or not: the other ingest loop (kept.py) may have made the
        # engine forget what was shown of a partition
        for partition in set(self._holding) | set(holds):
            self.caught_up.carrying(partition, holds.get(partition, {}))
        self._holding = holds

    def _counts(self) -> dict[int, int]:
        """Records carried, by partition."""
        counts: dict[int, int] = collections.Counter()
        for queue in self.queues.values():
            counts[queue.partition] += len(queue.items)
        return counts

    def _most_carrying(self, counts: dict[int, int], most: int) -> list[int]:
        """The partitions to pause so that no more than *most* records are carried: those
        that carry most first (one hot ordering id's, usually)."""
        if self.count <= most:
            return []
        paused, left = [], self.count
        for partition, count in sorted(counts.items(), key=lambda item: -item[1]):
            if left <= most:
                break
            paused.append(partition)
            left -= count
        return paused


class Batch:
    """One batch's operations in rounds: first what the records carried allow, each ordering
    id's a few rounds, then those read; past the last round, carried on (see the module)."""

    def __init__(self, carrier: Carrier, most_rounds: int = MOST_ROUNDS, *,
                 carried: bool = True) -> None:
        self.carrier = carrier
        self.rounds = Rounds(most_rounds)
        self.taken: dict[str, int] = {}  # per ordering id carried: how many of its first ones
        self.appended: dict[str, int] = {}  # per ordering id: how many read now were carried
        for ordering_id, queue in carrier.queues.items():  # none, unless *carried*
            self.taken[ordering_id] = self._take(queue) if carried else 0

    def _take(self, queue: _Queue) -> int:
        """How many of *queue*'s first records go in this batch: its plain schedule calls a
        run of up to ``CARRIED_A_ROUND`` a round (the engine releases none of those it holds
        back until all are written, so a round failing half-way leaves none released out of
        order), anything else one a round; at most ``CARRIED_A_BATCH``."""
        taken = 0
        items = queue.items
        while taken < min(len(items), CARRIED_A_BATCH):
            run: list[Operation] = []
            keys = set()
            for _, _, operation in itertools.islice(items, taken, taken + CARRIED_A_ROUND):
                if plain_order(operation) is None or operation.key in keys:
                    break
                run.append(operation)
                keys.add(operation.key)
            if len(run) > 1 and self.carrier.caught_up is not None:
                if not self.rounds.add_run(run):
                    break
                taken += len(run)
            else:
                if not self.rounds.add(items[taken][2]):
                    break
                taken += 1
        return taken

    def add(self, record: Record, operation: Operation) -> None:
        """Write *operation* (read as *record*) in this batch if a round has room for it,
        after every earlier one of its ordering id; else carry it."""
        ordering_id = operation.key.ordering_id
        if ordering_id in self.carrier.queues or not self.rounds.add(operation):
            self.carrier.append(ordering_id, record, operation)
            self.appended[ordering_id] = self.appended.get(ordering_id, 0) + 1

    def operations(self) -> Iterator[list[Operation]]:
        yield from self.rounds.rounds
