"""A batch that fails half-way never leaves a later task of an ordering id without an earlier one.

Cassandra writes of one round run concurrently, so when Cassandra goes down mid-batch any
subset of them may have landed. The chaos run found a later task of an ordering id stored
(and released) before an earlier one that had to wait for the batch to be applied again.
"""

from __future__ import annotations

from typing import Any

from celery_scheduler.dispatcher.engine import Engine
from celery_scheduler.dispatcher.ingest import Ingest
from celery_scheduler.envelope import CancelEnvelope, ScheduleEnvelope, encode
from celery_scheduler.errors import StoreUnavailableError
from celery_scheduler.keys import TaskKey
from celery_scheduler.partitioner import partition_for
from celery_scheduler.store.base import Cancel, Put, StoredTask
from celery_scheduler.store.memory import MemoryScheduleStore
from celery_scheduler.tasklog.dead_letters import DeadLetters
from tests.unit.fakes import NOW, PARTITIONS, Consumer, FakeProducer, Message, leased_engine, reader


class HalfDownStore(MemoryScheduleStore):
    """Writes every operation of a round except those of *failing* keys, then fails."""

    def __init__(self, failing: set[TaskKey]) -> None:
        super().__init__()
        self.failing = failing

    def apply(self, operations: list[Put | Cancel], now_ms: int) -> list[StoredTask | bool | None]:
        results = [super(HalfDownStore, self).apply([op], now_ms)[0]
                   for op in operations if op.key not in self.failing]
        if len(results) < len(operations):
            raise StoreUnavailableError("Cassandra went down during the round")
        return results


def test_a_failed_round_stops_the_later_tasks_of_its_ordering_ids() -> None:
    tasks = [ScheduleEnvelope(TaskKey(o, at, "u"), "proj.remind", [1])
             for o, at in (("a", 10), ("a", 20), ("b", 10), ("a", 30))]
    store = HalfDownStore(failing={tasks[0].key})
    consumer = Consumer([Message(t.key.ordering_id, offset, encode(t)) for offset, t in enumerate(tasks)])
    engine = leased_engine(store, range(PARTITIONS))
    ingest = Ingest(reader(consumer), store, engine, DeadLetters(FakeProducer(), "t.deadletter"),  # type: ignore[arg-type]
                    lambda: PARTITIONS, clock=lambda: NOW)

    assert ingest.poll_once() == 0  # failed: nothing committed, read again from the start

    assert consumer.committed == []
    assert {tp.offset for tp in consumer.sought} <= {0, 2}
    stored = {t.key for t in tasks if store.status(t.key) is not None}
    assert tasks[1].key not in stored and tasks[3].key not in stored  # nothing after a's first
    assert tasks[2].key in stored  # other ordering ids are not held back

    store.failing.clear()
    consumer.messages = [Message(t.key.ordering_id, offset, encode(t)) for offset, t in enumerate(tasks)]
    assert ingest.poll_once() == 4
    assert all(store.status(t.key) is not None for t in tasks)


def test_records_of_a_partition_without_its_lease_wait_until_the_lease_is_held() -> None:
    """Writing them would hide them from the holder's engine (see test_split_ownership)."""
    tasks = [ScheduleEnvelope(TaskKey(o, 10, "u"), "proj.remind", [1]) for o in ("a", "b")]
    a, b = (partition_for(t.key.ordering_id, PARTITIONS) for t in tasks)
    assert a != b
    store = MemoryScheduleStore()
    other = Engine(store, lambda task, release: None, "other", clock=lambda: NOW)
    other.assign([a])
    other.step()  # another dispatcher holds a's lease
    engine = leased_engine(store, range(PARTITIONS))
    messages = [Message(t.key.ordering_id, offset, encode(t)) for offset, t in enumerate(tasks)]
    consumer = Consumer(list(messages))
    ingest = Ingest(reader(consumer), store, engine, DeadLetters(FakeProducer(), "t.deadletter"),  # type: ignore[arg-type]
                    lambda: PARTITIONS, clock=lambda: NOW)

    assert not engine.may_persist(a) and engine.may_persist(b)
    assert ingest.poll_once() == 2
    assert store.status(tasks[0].key) is None  # held back
    assert store.status(tasks[1].key) is not None
    assert [tp.partition for batch in consumer.committed for tp in batch] == [b]
    assert [(tp.partition, tp.offset) for tp in consumer.sought] == [(a, 0)]
    assert consumer.paused == {a}

    ingest.poll_once()
    assert consumer.paused == {a}  # still not ours

    other.revoke([a])  # gives the lease up
    engine.partitions[a].next_attempt_mono = 0  # no need to wait to ask again
    engine.step()
    assert engine.may_persist(a)
    consumer.messages = [messages[0]]  # the consumer reads on from where it was sought
    assert ingest.poll_once() == 1
    assert consumer.paused == set()
    assert store.status(tasks[0].key) is not None


def test_a_hanging_ingest_loop_gives_the_leases_up() -> None:
    store = MemoryScheduleStore()
    engine = leased_engine(store, [0, 1])
    engine.ingest_alive()
    assert engine.may_persist(0) and engine.may_persist(1)

    engine.leases.ingest_mono -= engine.settings.ingest_stall_seconds + 1  # not back for too long
    engine.step()
    assert not engine.may_persist(0) and not engine.may_persist(1)
    assert all(p.lease is None for p in engine.partitions.values())
    other = Engine(store, lambda task, release: None, "other", clock=lambda: NOW)
    other.assign([0, 1])
    other.step()
    assert other.may_persist(0) and other.may_persist(1)  # readers of the partitions take over

    engine.ingest_alive()  # back: it may take leases again (once they are free)
    other.revoke([0, 1])
    for partition in engine.partitions.values():
        partition.next_attempt_mono = 0
    engine.step()
    assert engine.may_persist(0) and engine.may_persist(1)


def test_a_late_renewal_alone_does_not_stop_writes_but_a_lost_lease_does() -> None:
    store = MemoryScheduleStore()
    engine = leased_engine(store, [0])
    engine.partitions[0].lease_mono -= 60  # renewal long overdue: releasing stops...
    assert not engine.leases.may_release(engine.partitions[0])
    assert engine.may_persist(0)  # ...writing does not: the engine still holds the lease

    later = Engine(store, lambda task, release: None, "other", clock=lambda: NOW + 60_000)
    later.assign([0])
    later.step()  # the lease expired in the store: another dispatcher takes it
    assert later.may_persist(0)
    engine.step()  # its renewal finds the lease gone
    assert not engine.may_persist(0)


class RoundsStore(MemoryScheduleStore):
    """Keeps the keys of each round it is asked to apply."""

    def __init__(self) -> None:
        super().__init__()
        self.rounds: list[list[str]] = []

    def apply(self, operations: list[Any], now_ms: int) -> list[StoredTask | bool | None]:
        self.rounds.append([f"{type(op).__name__} {op.key.scheduled_ms}" for op in operations])
        return super().apply(operations, now_ms)


def test_cancels_of_an_ordering_id_in_a_row_share_a_round_after_what_came_before() -> None:
    """A bulk cancel of one ordering id is applied a round at a time, not a key at a time;
    a cancel still comes after the schedule record of its key."""
    puts = [ScheduleEnvelope(TaskKey("a", at, "u"), "proj.remind", [1]) for at in (10, 20)]
    records = [encode(puts[0]), encode(puts[1])] + [
        encode(CancelEnvelope(TaskKey("a", at, "u"), NOW)) for at in (20, 30, 40, 50)] + [
        encode(ScheduleEnvelope(TaskKey("a", 60, "u"), "proj.remind", [1])),
        encode(CancelEnvelope(TaskKey("a", 10, "u"), NOW))]
    store = RoundsStore()
    consumer = Consumer([Message("a", offset, data) for offset, data in enumerate(records)])
    engine = leased_engine(store, range(PARTITIONS))
    ingest = Ingest(reader(consumer), store, engine, DeadLetters(FakeProducer(), "t.deadletter"),  # type: ignore[arg-type]
                    lambda: PARTITIONS, clock=lambda: NOW)
    assert ingest.poll_once() == len(records)
    assert store.rounds == [["Put 10"], ["Put 20"], ["Cancel 20", "Cancel 30", "Cancel 40", "Cancel 50"],
                            ["Put 60"], ["Cancel 10"]]
