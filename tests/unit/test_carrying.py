"""A hot ordering id's records are written a few rounds a batch, the rest carried to the next
batch, so that the other ordering ids' records are not held back by them (carrying.py).

Nothing is committed past a carried record, the engine releases nothing of an ordering id
while a record of it is carried (a carried cancel still wins), a batch that fails keeps what
it carried, and memory stays bounded.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celery_scheduler.dispatcher import carrying
from celery_scheduler.dispatcher.caught_up import CaughtUp
from celery_scheduler.dispatcher.rounds import MOST_ROUNDS, Rounds
from celery_scheduler.envelope import CancelEnvelope, ScheduleEnvelope, encode
from celery_scheduler.errors import TaskLogUnavailableError
from celery_scheduler.keys import TaskKey
from celery_scheduler.partitioner import partition_for
from celery_scheduler.store.base import Cancel, Put, State
from celery_scheduler.store.memory import MemoryScheduleStore
from celery_scheduler.tasklog.memory import MemoryTaskLog
from tests.unit.budget import examples
from tests.unit.fakes import OutageStore
from tests.unit.test_caught_up import NOW, PARTITIONS, Dispatcher
from tests.unit.test_engine import Clock

HOT = "hot"
OTHER = next(f"other-{n}" for n in range(100)
             if partition_for(f"other-{n}", PARTITIONS) == partition_for(HOT, PARTITIONS))


def _publish(log: MemoryTaskLog, *envelopes: ScheduleEnvelope | CancelEnvelope) -> None:
    for envelope in envelopes:
        log.publish_async(envelope.key.ordering_id, encode(envelope)).result(1)


def _hot(count: int, due_ms: int = NOW + 60_000) -> list[ScheduleEnvelope]:
    return [ScheduleEnvelope(TaskKey(HOT, due_ms, f"u{n:04}"), "t") for n in range(count)]


def _stored(store: MemoryScheduleStore, envelopes: list[ScheduleEnvelope]) -> list[int]:
    return [n for n, e in enumerate(envelopes) if store.status(e.key) is not None]



@pytest.fixture
def one_a_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """Carried records written one a round, as a batch's own are: the tests that count rounds
    to see what is held back. Runs of carried schedule calls have tests of their own."""
    monkeypatch.setattr(carrying, "CARRIED_A_ROUND", 1)


def test_a_round_past_the_last_allowed_is_refused() -> None:
    rounds = Rounds(most=2)
    puts = [Put(0, envelope) for envelope in _hot(3)]
    assert [rounds.add(put) for put in puts] == [True, True, False]
    assert rounds.add(Put(0, ScheduleEnvelope(TaskKey("b", NOW, "u"), "t")))  # another id: round 1
    assert [len(round_) for round_ in rounds.rounds] == [2, 1]


@pytest.mark.usefixtures("one_a_round")
def test_a_hot_ordering_id_is_written_a_batch_of_rounds_at_a_time_and_others_at_once() -> None:
    log, store, clock = MemoryTaskLog(PARTITIONS), MemoryScheduleStore(), Clock(NOW)
    hot = _hot(2 * MOST_ROUNDS + 5)
    other = ScheduleEnvelope(TaskKey(OTHER, NOW + 60_000, "u"), "t")
    _publish(log, *hot, other)  # the other id's task is read after every hot one
    dispatcher = Dispatcher(log, store, clock)
    partition = partition_for(HOT, PARTITIONS)

    dispatcher.ingest.poll_once(0)
    assert _stored(store, hot) == list(range(MOST_ROUNDS))
    assert store.status(other.key) is not None  # not held back by the hot id's records
    assert dispatcher.reader.committed[partition] == MOST_ROUNDS  # the first one carried
    assert dispatcher.ingest.written_to[partition] == MOST_ROUNDS

    dispatcher.ingest.poll_once(0)  # nothing new read: the carried ones are written on
    assert _stored(store, hot) == list(range(2 * MOST_ROUNDS))
    dispatcher.ingest.poll_once(0)
    assert _stored(store, hot) == list(range(len(hot)))
    assert dispatcher.reader.committed[partition] == len(hot) + 1  # past the other's, now


@pytest.mark.usefixtures("one_a_round")
@pytest.mark.parametrize("shown", [True, False])
def test_a_carried_cancel_wins_over_the_release_of_its_task(shown: bool,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The hot id's first task is due; its cancel is read in the same batch but carried
    behind the rest for two batches. The broken variant (*shown* False) does not tell the
    engine which ordering ids are carried: it releases the task before its cancel is written."""
    if not shown:
        monkeypatch.setattr(CaughtUp, "carrying", lambda self, partition, ids: None)
    log, store, clock = MemoryTaskLog(PARTITIONS), MemoryScheduleStore(), Clock(NOW)
    hot = _hot(2 * MOST_ROUNDS + 3, due_ms=NOW + 1_000)
    _publish(log, *hot, CancelEnvelope(hot[0].key))
    dispatcher = Dispatcher(log, store, clock)
    dispatcher.ingest.poll_once(0)
    clock.ms = NOW + 1_000
    dispatcher.engine.step()  # waits: asks where the partition ends
    dispatcher.ingest.poll_once(0)  # shown applied to its end, the cancel still carried
    assert _stored(store, hot) == list(range(2 * MOST_ROUNDS))
    clock.ms += 100
    dispatcher.engine.step()
    assert (hot[0].key not in dispatcher.released) is shown
    for _ in range(2):
        dispatcher.ingest.poll_once(0)
        clock.ms += 100
        dispatcher.engine.step()
    status = store.status(hot[0].key)
    assert status is not None
    assert (status.state is State.CANCELLED) is shown
    assert (hot[0].key not in dispatcher.released) is shown


@pytest.mark.usefixtures("one_a_round")
def test_other_ordering_ids_and_the_hot_ones_head_are_released_while_the_rest_is_carried() -> None:
    log, store, clock = MemoryTaskLog(PARTITIONS), MemoryScheduleStore(), Clock(NOW)
    hot = _hot(4 * MOST_ROUNDS, due_ms=NOW + 1_000)
    other = ScheduleEnvelope(TaskKey(OTHER, NOW + 1_000, "u"), "t")
    _publish(log, *hot, other)
    dispatcher = Dispatcher(log, store, clock)
    clock.ms = NOW + 1_000
    for _ in range(2):
        dispatcher.ingest.poll_once(0)
        dispatcher.engine.step()
        clock.ms += 100
    # the hot id's carried tasks all come after its first: they cannot hold it back
    assert sorted(dispatcher.released) == sorted([other.key, hot[0].key])
    assert len(_stored(store, hot)) < len(hot)


@pytest.mark.usefixtures("one_a_round")
@pytest.mark.parametrize("held", [True, False])
def test_a_carried_task_due_before_the_stored_ones_holds_them_back(
        held: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Read first, the hot id's later tasks are stored; its earlier ones are carried. The
    broken variant (*held* False: a carried schedule call holds nothing back) releases a
    later task first."""
    if not held:
        monkeypatch.setattr(carrying._Queue, "held_from", lambda self: (2**63 - 1, ""))
    log, store, clock = MemoryTaskLog(PARTITIONS), MemoryScheduleStore(), Clock(NOW)
    hot = [ScheduleEnvelope(TaskKey(HOT, NOW + 1_000 + 200 - n, f"u{n:04}"), "t")
           for n in range(3 * MOST_ROUNDS + 5)]  # the later read, the earlier due
    _publish(log, *hot)
    dispatcher = Dispatcher(log, store, clock)
    clock.ms = NOW + 2_000
    for _ in range(2):  # shown caught up, two thirds of them written
        dispatcher.ingest.poll_once(0)
        dispatcher.engine.step()
        clock.ms += 100
    assert len(_stored(store, hot)) == 2 * MOST_ROUNDS
    assert (dispatcher.released == []) is held
    for _ in range(3):
        dispatcher.ingest.poll_once(0)
        dispatcher.engine.step()
        clock.ms += 100
    assert (dispatcher.released[0] == hot[-1].key) is held  # the earliest due first


def test_a_batch_that_fails_keeps_what_it_carried_and_commits_nothing_past_it() -> None:
    log, clock = MemoryTaskLog(PARTITIONS), Clock(NOW)
    store = OutageStore("apply")
    hot = _hot(2 * MOST_ROUNDS)
    _publish(log, *hot)
    dispatcher = Dispatcher(log, store, clock)
    partition = partition_for(HOT, PARTITIONS)
    dispatcher.ingest.poll_once(0)
    store.down = True
    more = ScheduleEnvelope(TaskKey(HOT, NOW + 90_000, "later"), "t")
    _publish(log, more)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("time.sleep", lambda seconds: None)
        assert dispatcher.ingest.poll_once(0) == 0
    assert dispatcher.reader.committed[partition] == MOST_ROUNDS
    store.down = False
    for _ in range(3):
        dispatcher.ingest.poll_once(0)
    assert _stored(store, [*hot, more]) == list(range(len(hot) + 1))
    assert dispatcher.reader.committed[partition] == len(hot) + 1


@pytest.mark.usefixtures("one_a_round")
def test_partitions_that_carry_too_much_are_paused_until_half_is_written(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(carrying, "MOST_CARRIED_BATCHES", 2)
    log, store, clock = MemoryTaskLog(PARTITIONS), MemoryScheduleStore(), Clock(NOW)
    dispatcher = Dispatcher(log, store, clock)
    dispatcher.ingest.batch_size = 50  # at most 100 carried
    monkeypatch.setattr("celery_scheduler.dispatcher.ingest.MOST_CARRIED_BATCHES", 2)
    partition = partition_for(HOT, PARTITIONS)
    _publish(log, *_hot(400))
    carried = []
    for _ in range(16):
        dispatcher.ingest.poll_once(0)
        carried.append((len(dispatcher.ingest.carrier), partition in dispatcher.reader._paused))
    assert max(count for count, _ in carried) <= 100 + 50
    assert any(paused for _, paused in carried)
    assert not carried[-1][1]  # read again once half was written
    for _ in range(10):
        dispatcher.ingest.poll_once(0)
    assert len(_stored(store, _hot(400))) == 400


def test_a_partition_whose_lease_is_lost_lets_its_carried_records_go(monkeypatch: pytest.MonkeyPatch
                                                                     ) -> None:
    log, store, clock = MemoryTaskLog(PARTITIONS), MemoryScheduleStore(), Clock(NOW)
    hot = _hot(2 * MOST_ROUNDS)
    _publish(log, *hot)
    dispatcher = Dispatcher(log, store, clock)
    partition = partition_for(HOT, PARTITIONS)
    dispatcher.ingest.poll_once(0)
    caught_up: Any = dispatcher.engine.releaser.caught_up
    assert caught_up.carried(partition, hot[-1].key)
    monkeypatch.setattr(dispatcher.engine, "may_persist", lambda p: p != partition)
    dispatcher.ingest.poll_once(0)
    assert len(dispatcher.ingest.carrier) == 0
    assert not caught_up.carried(partition, hot[-1].key)
    assert caught_up.until(partition) is None  # shown again only once read again
    assert dispatcher.ingest.applied_to.get(partition, 0) <= MOST_ROUNDS
    assert _stored(store, hot) == list(range(MOST_ROUNDS))
    monkeypatch.undo()
    for _ in range(3):
        dispatcher.ingest.poll_once(0)
    assert _stored(store, hot) == list(range(len(hot)))


class Recording(OutageStore):
    """Records each operation applied, in order, and fails while ``down``."""

    def __init__(self) -> None:
        super().__init__("apply")
        self.applied: list[Any] = []

    def apply(self, operations: Any, now_ms: int) -> Any:
        results = super().apply(operations, now_ms)
        self.applied.extend(operations)
        return results


steps = st.lists(st.tuples(st.sampled_from(["poll", "poll", "poll", "down", "up", "lease"]),
                           st.integers(0, 3)), max_size=40)
records = st.lists(st.tuples(st.sampled_from(["a", "b", "c", HOT]), st.integers(0, 5),
                             st.booleans()), min_size=1, max_size=60)


@settings(max_examples=examples(300), deadline=None)
@given(records, steps)
def test_carried_records_take_effect_in_order_and_nothing_is_committed_past_one_unwritten(
        published: list[tuple[str, int, bool]], plan: list[tuple[str, int]]) -> None:
    log, store, clock = MemoryTaskLog(PARTITIONS), Recording(), Clock(NOW)
    envelopes: list[ScheduleEnvelope | CancelEnvelope] = []
    for ordering_id, n, cancel in published:
        key = TaskKey(ordering_id, NOW + 60_000 + n, f"u{n}")
        envelopes.append(CancelEnvelope(key) if cancel else ScheduleEnvelope(key, "t"))
    _publish(log, *envelopes)
    dispatcher = Dispatcher(log, store, clock)
    dispatcher.ingest.most_rounds = 2
    dispatcher.ingest.batch_size = 7
    unleased: set[int] = set()
    may_persist = dispatcher.engine.may_persist

    def persisting(partition: int) -> bool:
        return partition not in unleased and may_persist(partition)

    dispatcher.engine.may_persist = persisting  # type: ignore[method-assign]
    offsets = {id(e): n for n, e in enumerate(envelopes)}
    of_partition = [[e for e in envelopes if partition_for(e.key.ordering_id, PARTITIONS) == p]
                    for p in range(PARTITIONS)]

    def check_committed() -> None:
        written = {(type(op).__name__, op.key) for op in store.applied}
        for partition, committed in enumerate(dispatcher.reader.committed):
            for envelope in of_partition[partition][:committed]:
                kind = "Cancel" if isinstance(envelope, CancelEnvelope) else "Put"
                assert (kind, envelope.key) in written, (partition, committed, offsets[id(envelope)])

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("time.sleep", lambda seconds: None)
        for action, which in plan:
            if action == "down":
                store.down = True
            elif action == "up":
                store.down = False
            elif action == "lease":
                unleased ^= {which % PARTITIONS}
            dispatcher.ingest.poll_once(0)
            check_committed()
        store.down, unleased = False, set()
        for _ in range(200):
            dispatcher.ingest.poll_once(0)
            if not dispatcher.ingest.carrier and all(
                    committed == len(of) for committed, of in zip(dispatcher.reader.committed,
                                                                   of_partition, strict=True)):
                break
        check_committed()
    # each ordering id's records took effect first in the order they were read
    for ordering_id in {e.key.ordering_id for e in envelopes}:
        expected = [("Cancel" if isinstance(e, CancelEnvelope) else "Put", e.key) for e in envelopes
                    if e.key.ordering_id == ordering_id]
        seen = [(type(op).__name__, op.key) for op in store.applied if op.key.ordering_id == ordering_id]
        assert list(dict.fromkeys(seen)) == list(dict.fromkeys(expected))


def test_what_a_queue_holds_back_moves_on_as_its_first_records_are_written() -> None:
    queue = carrying._Queue(0)
    puts = [Put(0, envelope) for envelope in _hot(5)]
    for seq, put in enumerate(puts):
        queue.append(seq, None, put)  # type: ignore[arg-type]  # the record is not looked at
    assert queue.held_from() == (NOW + 60_000, "u0000")
    queue.pop_written(2)
    assert queue.held_from() == (NOW + 60_000, "u0002")  # the written ones hold nothing back
    queue.append(5, None, Cancel(0, puts[4].envelope.key))  # type: ignore[arg-type]
    assert queue.held_from() is None  # a cancel carried holds the whole ordering id
    queue.drop_last(1)  # read again: not carried
    assert queue.held_from() == (NOW + 60_000, "u0002")


def test_a_commit_that_raises_leaves_the_batch_written_and_what_it_carries_held(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch was written and carried on, then its commit raised: a commit lost only
    means records read again. Treated as a failed batch, its carried records were let go
    while the partition stayed shown applied past them, and a task whose cancel was among
    them was released."""
    log, store, clock = MemoryTaskLog(PARTITIONS), MemoryScheduleStore(), Clock(NOW)
    key = TaskKey(HOT, NOW + 1_000, "k")
    later = [ScheduleEnvelope(TaskKey(HOT, NOW + 60_000, f"u{n:03}"), "t") for n in range(2 * MOST_ROUNDS)]
    _publish(log, ScheduleEnvelope(key, "t"), *later, CancelEnvelope(key))
    dispatcher = Dispatcher(log, store, clock)
    commit = dispatcher.reader.commit
    failing = [True]

    def commit_once_failing(offsets: Any) -> None:
        if failing.pop() if failing else False:
            raise TaskLogUnavailableError("could not commit offsets: the coordinator is away")
        commit(offsets)

    monkeypatch.setattr(dispatcher.reader, "commit", commit_once_failing)
    dispatcher.ingest.poll_once(0)  # the task and 31 more written, the rest carried; commit raises
    assert len(dispatcher.ingest.carrier) == MOST_ROUNDS + 2
    clock.ms = NOW + 1_000
    for _ in range(3):
        dispatcher.engine.step()
        dispatcher.ingest.poll_once(0)
        clock.ms += 100
    dispatcher.engine.step()
    assert key not in dispatcher.released
    status = store.status(key)
    assert status is not None and status.state is State.CANCELLED


@pytest.mark.usefixtures("one_a_round")
def test_memory_stays_bounded_when_a_paused_partition_is_taken_away_and_given_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("celery_scheduler.dispatcher.ingest.MOST_CARRIED_BATCHES", 2)
    log, store, clock = MemoryTaskLog(PARTITIONS), MemoryScheduleStore(), Clock(NOW)
    dispatcher = Dispatcher(log, store, clock)
    dispatcher.ingest.batch_size = 50  # at most 100 carried, and a batch more
    partition = partition_for(HOT, PARTITIONS)
    _publish(log, *_hot(1000))
    for _ in range(20):
        dispatcher.ingest.poll_once(0)
        if partition in dispatcher.ingest.carrier.paused:
            break
    assert partition in dispatcher.ingest.carrier.paused
    dispatcher.ingest.revoked([partition])  # a rebalance takes it away and gives it back
    dispatcher.reader.revoke([partition])
    dispatcher.reader.assign([partition])
    dispatcher.ingest.assigned([partition])
    assert partition not in dispatcher.ingest.carrier.paused
    _publish(log, *[ScheduleEnvelope(TaskKey(HOT, NOW + 90_000, f"v{n:04}"), "t") for n in range(2000)])
    most = 0
    for _ in range(60):
        dispatcher.ingest.poll_once(0)
        most = max(most, len(dispatcher.ingest.carrier))
    assert most <= 100 + 50


def test_a_queue_keeps_no_more_places_than_it_has_records_and_a_little() -> None:
    queue = carrying._Queue(0)
    seq = 0
    for round_ in range(300):  # one eta, uniqueness keys in no order: nothing comes to the top
        for _ in range(32 if round_ else 1_000):
            seq += 1
            envelope = ScheduleEnvelope(TaskKey(HOT, NOW, f"{(seq * 7919) % 100_003:06}"), "t")
            queue.append(seq, None, Put(0, envelope))  # type: ignore[arg-type]
        queue.pop_written(32)
        queue.held_from()
    assert len(queue.plain) <= 2 * len(queue.items) + 16


class CountingStore(MemoryScheduleStore):
    """Counts the write requests (one ``apply`` a round)."""

    def __init__(self) -> None:
        super().__init__()
        self.applied = 0

    def apply(self, operations: Any, now_ms: int) -> Any:
        self.applied += 1
        return super().apply(operations, now_ms)


def test_a_hot_ordering_ids_carried_schedule_calls_are_written_in_runs() -> None:
    """Past a batch's rounds, a hot id's carried schedule calls go a run of
    ``CARRIED_A_ROUND`` a round, ``CARRIED_A_BATCH`` a batch: the 140 records past the
    first batch's rounds in 3 batches of a request each, not 5 of 32 requests."""
    log, store, clock = MemoryTaskLog(PARTITIONS), CountingStore(), Clock(NOW)
    hot = _hot(MOST_ROUNDS + 2 * carrying.CARRIED_A_BATCH + 12)
    _publish(log, *hot)
    dispatcher = Dispatcher(log, store, clock)
    partition = partition_for(HOT, PARTITIONS)
    dispatcher.ingest.poll_once(0)
    assert _stored(store, hot) == list(range(MOST_ROUNDS))  # read now: one a round
    store.applied = 0
    dispatcher.ingest.poll_once(0)
    assert _stored(store, hot) == list(range(MOST_ROUNDS + carrying.CARRIED_A_BATCH))
    assert store.applied == carrying.CARRIED_A_BATCH // carrying.CARRIED_A_ROUND
    for _ in range(2):
        dispatcher.ingest.poll_once(0)
    assert _stored(store, hot) == list(range(len(hot)))
    assert store.applied == 3 * (carrying.CARRIED_A_BATCH // carrying.CARRIED_A_ROUND)
    assert dispatcher.reader.committed[partition] == len(hot)


def test_a_carried_cancel_ends_a_run_and_takes_effect_after_the_calls_before_it() -> None:
    log, store, clock = MemoryTaskLog(PARTITIONS), CountingStore(), Clock(NOW)
    hot = _hot(MOST_ROUNDS + 60)
    cancelled = hot[MOST_ROUNDS + 5]
    _publish(log, *hot[:MOST_ROUNDS + 10], CancelEnvelope(cancelled.key), *hot[MOST_ROUNDS + 10:])
    dispatcher = Dispatcher(log, store, clock)
    dispatcher.ingest.poll_once(0)
    store.applied = 0
    dispatcher.ingest.poll_once(0)  # a run of 10, the cancel alone, a run of 50
    assert store.applied == 3
    status = store.status(cancelled.key)
    assert status is not None and status.state is State.CANCELLED
    assert _stored(store, hot) == list(range(len(hot)))


@pytest.mark.parametrize("waits_on_cancel", [True, False])
def test_records_carried_are_written_at_a_pace_unless_a_cancel_waits_for_them(
        waits_on_cancel: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hot id's plain schedule calls carried are written a batch a pace (it runs one at a
    time: a faster pace takes CPU and store requests from the others' releases); a batch
    read meanwhile writes its own records and carries more. A carried cancel holds the whole
    ordering id back, so the next batch writes what is carried at once. The broken variant
    paces a carried cancel too: it stays unwritten."""
    if not waits_on_cancel:
        monkeypatch.setattr(carrying.Carrier, "waited_for", lambda self: bool(self.paused))
    log, store, clock = MemoryTaskLog(PARTITIONS), MemoryScheduleStore(), Clock(NOW)
    hot = _hot(MOST_ROUNDS + 2 * carrying.CARRIED_A_BATCH)
    _publish(log, *hot)
    dispatcher = Dispatcher(log, store, clock)
    dispatcher.ingest.carry_pace = 3600.0  # the next batch of carried records is an hour away
    dispatcher.ingest.poll_once(0)  # the first batch: what it read, a round each
    assert _stored(store, hot) == list(range(MOST_ROUNDS))
    dispatcher.ingest.poll_once(0)  # a batch of what is carried, and the next an hour later
    written = MOST_ROUNDS + carrying.CARRIED_A_BATCH
    assert _stored(store, hot) == list(range(written))
    other = ScheduleEnvelope(TaskKey(OTHER, NOW + 60_000, "u"), "t")
    _publish(log, other, ScheduleEnvelope(TaskKey(HOT, NOW + 60_000, "u9999"), "t"))
    dispatcher.ingest.poll_once(0)
    assert store.status(other.key) is not None  # written: a batch of its own
    assert _stored(store, hot) == list(range(written))  # the rest carried: not due yet
    assert len(dispatcher.ingest.carrier) == carrying.CARRIED_A_BATCH + 1

    _publish(log, CancelEnvelope(hot[-1].key))
    dispatcher.ingest.poll_once(0)  # reads the cancel, carried behind the rest
    for _ in range(2):  # 65 schedule calls and the cancel: two batches
        dispatcher.ingest.poll_once(0)
    status = store.status(hot[-1].key)
    assert (status is not None and status.state is State.CANCELLED) is waits_on_cancel


def test_a_poll_between_two_batches_of_carried_records_never_waits_a_negative_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The clock moves between the look at whether a batch of carried records is due and the
    wait for the next records: the wait must not come out below zero, as Kafka's consumer
    takes any negative timeout as "wait forever" (a dispatcher stopped writing a bulk load
    that way, 2,080 of 10,000 keys stored, once nothing more came to read)."""
    # each look at the clock up to 0.15 s after the one before: now and then past the due time
    steps = random.Random(7)
    now = [100.0]

    def monotonic() -> float:
        now[0] += steps.uniform(0.0, 0.15)
        return now[0]

    monkeypatch.setattr("celery_scheduler.dispatcher.ingest.time.monotonic", monotonic)
    log, store, clock = MemoryTaskLog(PARTITIONS), MemoryScheduleStore(), Clock(NOW)
    hot = _hot(MOST_ROUNDS + 40 * carrying.CARRIED_A_BATCH)
    _publish(log, *hot)
    dispatcher = Dispatcher(log, store, clock)
    dispatcher.ingest.carry_pace = 0.2
    timeouts: list[float] = []
    consume = dispatcher.reader.consume

    def recording(num_messages: int = 1, timeout: float = 0.0) -> Any:
        timeouts.append(timeout)
        return consume(num_messages, timeout)

    monkeypatch.setattr(dispatcher.reader, "consume", recording)
    for _ in range(200):
        dispatcher.ingest.poll_once(0.2)
    assert min(timeouts) >= 0, timeouts
    assert any(0 < timeout < 0.2 for timeout in timeouts)  # some polls waited for the pace
    assert _stored(store, hot) == list(range(len(hot)))
