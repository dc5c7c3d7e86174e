"""What a batch writes now and what it carries to the next: a hot ordering id's records.

A batch writes its records in rounds, one record of an ordering id a round (rounds.py), and
each round waits for the one before. Ten thousand tasks of one ordering id scheduled in bulk
would make every batch that reads a thousand of them a thousand rounds long, and every other
record of the batch, of any ordering id, would wait for them. So a batch stops at
``MOST_ROUNDS``: the records of an ordering id past its last round are carried, decoded and
in the order read, to the next batch, which writes them before anything read after them.

Nothing is committed past a carried record: a partition's committed offset stays at its first
carried record until that record is written, and a restart or a new owner reads from there
again (every write is idempotent). A partition is shown caught up past its carried records
only together with what they hold back (see caught_up.py), until they are written: of an
ordering id with a carried cancel (or retry, move, or task named by its task id), nothing
is released, as the cancel must still win; of one with only plain schedule calls carried,
nothing that comes after the earliest of them.

Carried records stay in memory: at most ``MOST_CARRIED_BATCHES`` batches of them. Past that,
the partitions that carry most are paused until half as many are carried, so memory stays
bounded whatever one ordering id holds.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from celery_scheduler.dispatcher.caught_up import CaughtUp
from celery_scheduler.dispatcher.rounds import MOST_ROUNDS, Rounds
from celery_scheduler.store.records import Operation, Put
from celery_scheduler.tasklog.base import Record

__all__ = ["MOST_CARRIED_BATCHES", "Batch", "Carried", "Carrier", "Order", "held_from", "most_carrying"]

# its lines are the ingest loop's
logger = logging.getLogger("celery_scheduler.dispatcher.ingest")

# Records carried at most, in batches (scheduler_ingest_batch_size each).
MOST_CARRIED_BATCHES = 20

Carried = tuple[Record, Operation]
# A task's place among its ordering id's: (scheduled time, uniqueness key).
Order = tuple[int, str]
NOT_HELD: Order = (2**63 - 1, "")


def held_from(operation: Operation, before: Order | None) -> Order | None:
    """From where a carried *operation* holds its ordering id back, given where the ones
    carried before it do: a plain schedule call, only the tasks that come after its own
    (it adds one before them); anything else, all of them (None): a cancel, a retry, a move,
    or a task named by its own task id, which may move another key."""
    if before is None or not isinstance(operation, Put) or "task_id" in operation.envelope.options:
        return None
    key = operation.envelope.key
    return min(before, (key.scheduled_ms, key.uniqueness_key))


class Batch:
    """One batch's operations in rounds, and the records it carries to the next."""

    def __init__(self, most_rounds: int = MOST_ROUNDS) -> None:
        self.rounds = Rounds(most_rounds)
        self.carried: list[Carried] = []
        # per partition: what the records carried hold back (see held_from), and the first
        # one's offset
        self.holds: dict[int, dict[str, Order | None]] = {}
        self.first_carried: dict[int, int] = {}

    def add(self, record: Record, operation: Operation) -> None:
        """Write *operation* (read as *record*) in this batch if a round has room for it,
        after every earlier one of its ordering id; else carry it."""
        partition, ordering_id = record.partition, operation.key.ordering_id
        holds = self.holds.get(partition)
        if (holds is not None and ordering_id in holds) or not self.rounds.add(operation):
            self.carried.append((record, operation))
            holds = self.holds.setdefault(partition, {})
            holds[ordering_id] = held_from(operation, holds.get(ordering_id, NOT_HELD))
            self.first_carried.setdefault(partition, record.offset)

    def written_to(self, partition: int, read_past: int) -> int:
        """The offset below which every record of *partition* is written once this batch is:
        its first carried record's, or *read_past*, the offset after the last one read."""
        return self.first_carried.get(partition, read_past)


def most_carrying(carried: list[Carried], most: int) -> list[int]:
    """The partitions to pause so that the records carried are no more than *most*: those
    that carry most first (one hot ordering id's, usually)."""
    if len(carried) <= most:
        return []
    counts: dict[int, int] = {}
    for record, _ in carried:
        counts[record.partition] = counts.get(record.partition, 0) + 1
    paused, left = [], len(carried)
    for partition, count in sorted(counts.items(), key=lambda item: -item[1]):
        if left <= most:
            break
        paused.append(partition)
        left -= count
    return paused


class Carrier:
    """What the ingest loop carries from one batch to the next, the ordering ids it has shown
    the engine held for them (through *caught_up*), and the partitions it stopped reading as
    they carried too much. It does no I/O: the ingest loop pauses and resumes what it says.
    """

    def __init__(self, caught_up: CaughtUp | None) -> None:
        self.caught_up = caught_up
        self.records: list[Carried] = []
        self.paused: set[int] = set()
        self.carrying = False  # whether the last batch carried any (said when it changes)
        self._holding: dict[int, dict[str, Order | None]] = {}  # what was shown held, by partition

    def take(self, partitions: Iterable[int] = ()) -> list[Carried]:
        """The records carried, no longer kept here (put back with :meth:`keep` or
        :meth:`put_back`), but those of *partitions*, let go (see :meth:`let_go`)."""
        records, self.records = self.records, []
        gone = set(partitions)
        return [c for c in records if c[0].partition not in gone] if gone else records

    def put_back(self, records: list[Carried]) -> None:
        """A batch failed: what it was given to carry is carried still (and still held)."""
        self.records = records

    def keep(self, batch: Batch, most: int) -> tuple[list[int], list[int]]:
        """Carry what *batch* carries to the next one, and show the engine the ordering ids it
        holds (before it is shown the partitions applied past them). The partitions to
        pause, as they carry too much, and to resume, as half as much is carried."""
        if self.carrying != bool(batch.carried):
            self.carrying = bool(batch.carried)
            logger.info("%s", f"carrying {len(batch.carried)} records of hot ordering ids to later "
                        f"batches ({batch.rounds.most} rounds a batch)" if batch.carried else
                        "the records carried to later batches are all written")
        self.records = batch.carried
        if self.caught_up is not None:
            for partition in set(self._holding) | set(batch.holds):
                holds = batch.holds.get(partition, {})
                if holds != self._holding.get(partition, {}):
                    self.caught_up.carrying(partition, holds)
            self._holding = batch.holds
        resume: list[int] = []
        if self.paused and len(self.records) <= most // 2:
            resume, self.paused = sorted(self.paused), set()
        pause = [p for p in most_carrying(self.records, most) if p not in self.paused]
        self.paused.update(pause)
        return pause, resume

    def let_go(self, partitions: Iterable[int]) -> None:
        """The records carried of *partitions* are read again from the committed offset (by
        this process or their new owner): not kept, and not shown held any more."""
        gone = set(partitions)
        self.records = [c for c in self.records if c[0].partition not in gone]
        for partition in gone:
            self._holding.pop(partition, None)
            self.paused.discard(partition)
