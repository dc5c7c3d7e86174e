"""Kept partitions (a lost group session) are read by hand, written at once, never committed."""

from __future__ import annotations

import threading
from typing import Any

from celery_scheduler.dispatcher.ingest import Ingest
from celery_scheduler.dispatcher.kept import KeptReader
from celery_scheduler.envelope import ScheduleEnvelope, encode
from celery_scheduler.keys import TaskKey
from celery_scheduler.partitioner import partition_for
from celery_scheduler.store.memory import MemoryScheduleStore
from celery_scheduler.tasklog.base import TaskLogReader
from celery_scheduler.tasklog.dead_letters import DeadLetters
from celery_scheduler.tasklog.reader import HandAssignedReader
from tests.unit.fakes import NOW, PARTITIONS, Consumer, FakeProducer, Message, leased_engine, reader


class HandAssigned(Consumer):
    """The fakes' consumer, with the calls of a consumer assigned by hand."""

    def __init__(self) -> None:
        super().__init__([])
        self.assigned: list[tuple[int, int]] = []  # (partition, offset asked for)
        self.closed = threading.Event()

    def incremental_assign(self, partitions: list[Any]) -> None:
        self.assigned += [(tp.partition, tp.offset) for tp in partitions]

    def incremental_unassign(self, partitions: list[Any]) -> None:
        gone = {tp.partition for tp in partitions}
        self.assigned = [entry for entry in self.assigned if entry[0] not in gone]

    def close(self) -> None:
        self.closed.set()


def _kept(leased: range) -> tuple[KeptReader, list[HandAssigned], MemoryScheduleStore]:
    store = MemoryScheduleStore()
    engine = leased_engine(store, leased)
    made: list[HandAssigned] = []

    def consumer() -> Any:
        made.append(HandAssigned())
        return made[-1]

    def ingest(reader: TaskLogReader) -> Ingest:
        return Ingest(reader, store, engine, DeadLetters(FakeProducer(), "t.deadletter"),  # type: ignore[arg-type]
                      lambda: PARTITIONS, clock=lambda: NOW)

    return KeptReader(lambda: HandAssignedReader("t", consumer), ingest), made, store


def test_kept_partitions_are_assigned_by_hand_from_where_the_groups_ingest_stopped() -> None:
    kept, made, _ = _kept(range(PARTITIONS))
    assert kept.read_once(0.01) == 0  # nothing kept: no consumer is made
    assert made == []

    kept.follow([3, 1], {3: 40, 5: 7})
    kept.follow([1, 3], {3: 41})  # the same set: nothing changes
    assert len(made) == 1
    # where the group's ingest stopped; unknown (-1001): from the group's committed offset
    assert made[0].assigned == [(1, -1001), (3, 40)]
    assert kept.partitions == [1, 3]

    kept.follow([3, 4], {4: 12})  # one given up, one lost since: the same consumer follows
    assert len(made) == 1 and sorted(made[0].assigned) == [(3, 40), (4, 12)]


def test_what_is_read_is_written_at_once_and_never_committed() -> None:
    kept, made, store = _kept(range(PARTITIONS))
    task = ScheduleEnvelope(TaskKey("a", NOW + 5_000, "u"), "proj.remind", [1])
    kept.follow([partition_for(b"a", PARTITIONS)], {})
    made[0].messages = [Message("a", 7, encode(task))]

    assert kept.read_once(0.01) == 1
    assert store.status(task.key) is not None
    # the group's member reads it again from the committed offset, and writes it again
    assert made[0].committed == []


def test_a_partition_not_leased_is_not_written() -> None:
    kept, made, store = _kept(range(0))  # the engine holds no lease
    task = ScheduleEnvelope(TaskKey("a", NOW + 5_000, "u"), "proj.remind", [1])
    kept.follow([partition_for(b"a", PARTITIONS)], {})
    made[0].messages = [Message("a", 7, encode(task))]

    kept.read_once(0.01)
    assert store.status(task.key) is None


def test_nothing_kept_closes_the_consumer_and_a_new_loss_makes_another() -> None:
    kept, made, _ = _kept(range(PARTITIONS))
    kept.follow([2], {})
    kept.follow([], {})  # the group assigned again, or the partitions were given up
    assert made[0].closed.wait(5)
    assert kept.partitions == [] and kept.read_once(0.01) == 0

    kept.follow([2], {})
    assert len(made) == 2 and made[1].assigned == [(2, -1001)]
    kept.close()
    assert made[1].closed.wait(5)


def test_the_groups_ingest_records_where_it_wrote_up_to_until_assigned_again() -> None:
    store = MemoryScheduleStore()
    written, held_back = ("a", NOW + 5_000), ("b", NOW + 6_000)
    ingest = Ingest(reader(Consumer([])), store,
                    leased_engine(store, [partition_for(b"a", PARTITIONS)]),
                    DeadLetters(FakeProducer(), "t.deadletter"), lambda: PARTITIONS,  # type: ignore[arg-type]
                    clock=lambda: NOW)
    assert partition_for(b"b", PARTITIONS) != partition_for(b"a", PARTITIONS)
    ingest.consumer.consumer.messages = [  # type: ignore[attr-defined]
        Message(o, offset, encode(ScheduleEnvelope(TaskKey(o, at, "u"), "proj.remind", [])))
        for offset, (o, at) in ((3, written), (4, held_back))]

    assert ingest.poll_once(0.01) == 2
    # the partition not leased was not written: no offset is known for it
    assert ingest.written_to == {partition_for(b"a", PARTITIONS): 4}
    ingest.assigned([partition_for(b"a", PARTITIONS)])
    assert ingest.written_to == {}  # assigned again: it goes on from the committed offset
