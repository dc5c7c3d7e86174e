"""Releases marked ahead of their due time and sent at it, by the engine's sender thread.

These run on the real clock: the sender waits in real time.
"""

from __future__ import annotations

import time

import pytest

from celery_scheduler.clock import now_ms
from celery_scheduler.dispatcher.engine import Engine, EngineSettings
from celery_scheduler.dispatcher.ontime import OnTimeSender
from celery_scheduler.dispatcher.state import Sending, Sent
from celery_scheduler.dispatcher.timetable import Loaded, Timetable
from celery_scheduler.envelope import ScheduleEnvelope
from celery_scheduler.errors import ReleaseNotSentError, ReleaseUncertainError
from celery_scheduler.keys import TaskKey
from celery_scheduler.release.confirms import Unconfirmed
from celery_scheduler.store.base import State
from celery_scheduler.store.memory import MemoryScheduleStore
from celery_scheduler.wire import Release
from tests.waiting import wait_until

AHEAD_MS = 400
LEASE_MS = 60_000



def loaded(ordering_id: str, due_ms: int, partition: int = 0, **fields: int) -> Loaded:
    return Loaded(partition, ScheduleEnvelope(TaskKey(ordering_id, due_ms, "u"), "t"), **fields)


class Sends:
    """The publish side of an engine: when each release reached it (wall clock, ms)."""

    def __init__(self) -> None:
        self.at: dict[TaskKey, int] = {}

    def __call__(self, task: Loaded, release: Release) -> None:
        self.at[task.key] = now_ms()


def engine_with(store: MemoryScheduleStore, sends: Sends) -> Engine:
    engine = Engine(store, sends, "owner-1", EngineSettings(
        tick_seconds=0.01, release_ahead_seconds=AHEAD_MS / 1000,
        start_lease_seconds=LEASE_MS / 1000))
    engine.assign([0])
    engine.step()  # takes the lease
    assert engine.partitions[0].lease is not None
    return engine


def schedule(store: MemoryScheduleStore, engine: Engine, ordering_id: str, due_ms: int) -> TaskKey:
    stored = store.put(0, ScheduleEnvelope(TaskKey(ordering_id, due_ms, "u"), "t"), now_ms())
    assert stored is not None
    engine.persisted(stored)
    return stored.key


def test_take_due_ahead_takes_what_falls_due_within_it_but_no_task_whose_earlier_copy_is_leased(
) -> None:
    table = Timetable()
    soon, later = loaded("a", 1_150), loaded("b", 1_300)
    leased = loaded("c", 1_000, attempts=1, lease_until_ms=1_100)  # a previous owner's release
    for task in (soon, later, leased):
        table.add(task)
    assert table.take_due(1_000) == []
    assert table.take_due(1_000, ahead_ms=200) == [soon]
    # the leased one is due once its lease has ended, however far ahead is looked
    assert table.take_due(1_099, ahead_ms=1_000) == [later]
    assert table.take_due(1_100) == [leased]


def test_what_an_ahead_look_may_not_take_yet_counts_at_its_due_time_not_ahead_of_it() -> None:
    table = Timetable()
    leased = loaded("c", 1_000, attempts=1, lease_until_ms=1_100)  # a previous owner's release
    put_off = loaded("d", 900)
    table.add(leased)
    table.add(put_off)
    assert table.take_due(900) == [put_off]
    table.defer(put_off.key, 1_300)  # e.g. its partition's lease was not certain
    assert table.next_take_ms(200) == 900  # the leased head, looked at 200 ms ahead
    assert table.take_due(1_000, ahead_ms=200) == []
    assert table.next_take_ms(200) == 1_100  # parked until due: no look ahead takes them
    assert table.take_due(1_099, ahead_ms=200) == []
    assert table.take_due(1_100, ahead_ms=200) == [leased]
    assert table.take_due(1_299, ahead_ms=200) == []
    assert table.take_due(1_300, ahead_ms=200) == [put_off]


def test_the_engine_does_not_spin_while_a_previous_owners_release_nears_its_lease_end() -> None:
    store, sends = MemoryScheduleStore(), Sends()
    engine = engine_with(store, sends)
    try:
        start = now_ms()
        engine.timetable.add(loaded("c", start - 1_000, attempts=1, lease_until_ms=start + 300))
        steps = 0
        while now_ms() < start + 250:
            engine.step()
            steps += 1
        # at most one step per 10 ms tick, and the ones its outcome poll wakes (spinning: >1,000)
        assert steps < 60, steps
    finally:
        engine.stop()


def test_a_task_is_marked_ahead_and_sent_at_its_due_time_not_before() -> None:
    store, sends = MemoryScheduleStore(), Sends()
    engine = engine_with(store, sends)
    try:
        due = now_ms() + AHEAD_MS // 2
        key = schedule(store, engine, "a", due)
        engine.step()
        status = store.status(key)
        assert status is not None and status.state is State.RELEASED
        assert key not in sends.at  # marked, not sent: it is not due yet
        wait_until(lambda: key in sends.at, 5, every=0.005)
        assert sends.at[key] >= due
        task = engine.timetable.get(key)
        assert task is not None
        assert task.lease_until_ms == due + LEASE_MS  # its start lease counts from its due time
        assert engine.released_count == 0
        engine.step()  # the Sent event
        assert engine.released_count == 1
    finally:
        engine.stop()


def test_marking_waits_for_the_first_task_to_come_near_and_takes_all_due_within_ahead() -> None:
    class CountingStore(MemoryScheduleStore):
        def __init__(self) -> None:
            super().__init__()
            self.marks: list[int] = []

        def mark_released_many(self, releases, now_ms):  # type: ignore[no-untyped-def]
            self.marks.append(len(releases))
            super().mark_released_many(releases, now_ms)

    store, sends = CountingStore(), Sends()
    engine = Engine(store, sends, "owner-1", EngineSettings(
        tick_seconds=0.01, release_ahead_seconds=1.0, lease_seconds=LEASE_MS / 1000))
    engine.assign([0])
    engine.step()
    try:
        start = now_ms()
        first = schedule(store, engine, "a", start + 800)
        second = schedule(store, engine, "b", start + 950)
        engine.step()
        assert store.marks == []  # both within a second, neither within 600 ms yet
        wait_until(lambda: now_ms() >= start + 210, 5, every=0.005)
        engine.step()
        assert store.marks == [2]  # the first came within 600 ms: both marked at once
        for key in (first, second):
            status = store.status(key)
            assert status is not None and status.state is State.RELEASED
        wait_until(lambda: second in sends.at, 5, every=0.005)
        assert sends.at[first] >= start + 800 and sends.at[second] >= start + 950
    finally:
        engine.stop()


def test_a_release_whose_lease_is_not_certain_at_its_due_time_is_put_back_unspent() -> None:
    store, sends = MemoryScheduleStore(), Sends()
    engine = engine_with(store, sends)
    try:
        key = schedule(store, engine, "a", now_ms() + 200)
        engine.step()
        assert engine.timetable.is_in_flight(key)
        engine.leases.forget_fence(0)  # as if the lease ran out before the due time
        wait_until(lambda: engine._sender is not None and engine._sender.waiting() == 0, 5, every=0.005)
        time.sleep(0.05)
        engine.step()
        assert key not in sends.at
        task = engine.timetable.get(key)
        assert task is not None and task.attempts == 0 and not engine.timetable.is_in_flight(key)
        status = store.status(key)
        assert status is not None and status.state is State.PENDING and status.attempts == 0
    finally:
        engine.stop()


def test_a_revocation_sends_what_was_marked_ahead_before_it_gives_the_lease_up() -> None:
    store, sends = MemoryScheduleStore(), Sends()
    engine = engine_with(store, sends)
    due = now_ms() + AHEAD_MS // 2
    key = schedule(store, engine, "a", due)
    engine.step()
    assert key not in sends.at
    assert engine.revoke([0])
    assert key in sends.at and sends.at[key] >= due
    assert store.acquire_lease(0, "owner-2", 10_000, now_ms()) is not None  # given up
    engine.stop()


def test_the_sender_sends_each_release_at_its_due_time_in_due_order() -> None:
    sent: list[Sent] = []
    published: list[tuple[TaskKey, int]] = []

    def publish_many(items: list[tuple[Loaded, Release]]) -> list[Exception | None]:
        published.extend((task.key, now_ms()) for task, _ in items)
        return [None] * len(items)

    sender = OnTimeSender(publish_many, sent.append, lambda partition: partition == 0)
    try:
        start = now_ms()
        items = [Sending(loaded(f"o{offset}", start + offset, partition=partition),
                         Release(TaskKey(f"o{offset}", start + offset, "u"), partition, 1, 1, 0),
                         start + offset)
                 for offset, partition in ((300, 0), (-50, 0), (150, 0), (200, 1))]
        sender.hand(items)
        assert sender.settle([0, 1], timeout=5.0)
        assert [key.ordering_id for key, _ in published] == ["o-50", "o150", "o300"]
        for key, at in published:
            assert at >= key.scheduled_ms
        results = {item.task.key.ordering_id: error for event in sent for item, error in event.results}
        assert results["o300"] is None and results["o-50"] is None
        assert isinstance(results["o200"], ReleaseNotSentError)  # partition 1's lease: not certain
    finally:
        sender.stop()


def test_a_task_its_worker_holds_is_sent_once_marked_carrying_its_due_time() -> None:
    store = MemoryScheduleStore()
    releases: dict[TaskKey, tuple[int, Release]] = {}

    def publish(task: Loaded, release: Release) -> None:
        releases[task.key] = (now_ms(), release)

    engine = Engine(store, publish, "owner-1", EngineSettings(
        tick_seconds=0.01, release_ahead_seconds=AHEAD_MS / 1000,
        start_lease_seconds=LEASE_MS / 1000),
        sends_early=lambda task: task.key.ordering_id != "topic")
    engine.assign([0])
    engine.step()
    try:
        due = now_ms() + AHEAD_MS // 2
        early, held = schedule(store, engine, "a", due), schedule(store, engine, "topic", due)
        engine.step()
        wait_until(lambda: early in releases, 5, every=0.005)
        sent_at, release = releases[early]
        assert sent_at < due  # gone to the broker before it is due ...
        assert release.not_before_ms == due  # ... saying when it may start
        assert release.lease_until_ms == due + LEASE_MS  # its start lease still counts from its due time
        assert held not in releases  # one the broker's consumer would not hold waits for its time
        wait_until(lambda: held in releases, 5, every=0.005)
        assert releases[held][0] >= due and releases[held][1].not_before_ms == due
    finally:
        engine.stop()


def test_the_sender_sends_an_early_release_at_once_but_not_without_a_certain_lease() -> None:
    sent: list[Sent] = []
    published: list[TaskKey] = []

    def publish_many(items: list[tuple[Loaded, Release]]) -> list[Exception | None]:
        published.extend(task.key for task, _ in items)
        return [None] * len(items)

    sender = OnTimeSender(publish_many, sent.append, lambda partition: partition == 0)
    try:
        due = now_ms() + 60_000
        items = [Sending(loaded(f"o{partition}", due, partition=partition),
                         Release(TaskKey(f"o{partition}", due, "u"), partition, 1, 1, 0, due), due,
                         early=True)
                 for partition in (0, 1)]
        sender.hand(items)
        assert sender.settle([0, 1], timeout=2.0)  # a minute before they are due
        assert published == [TaskKey("o0", due, "u")]
        results = {item.task.partition: error for event in sent for item, error in event.results}
        assert results[0] is None and isinstance(results[1], ReleaseNotSentError)
    finally:
        sender.stop()


def test_the_sender_builds_messages_while_they_wait_and_sends_what_it_built() -> None:
    sent: list[Sent] = []
    built: list[tuple[TaskKey, int]] = []
    published: list[tuple[TaskKey, object, int]] = []

    def prepare_many(items: list[tuple[Loaded, Release]]) -> list[object]:
        built.extend((task.key, now_ms()) for task, _ in items)
        # one the publisher cannot build ahead (the first of its route, say) is built when sent
        return [None if task.key.ordering_id == "o-unbuilt" else f"message of {task.key.ordering_id}"
                for task, _ in items]

    def publish_prepared(items: list[tuple[Loaded, Release]], prepared: list[object]
                         ) -> list[Exception | None]:
        at = now_ms()
        published.extend((task.key, message, at) for (task, _), message in zip(items, prepared, strict=True))
        return [None] * len(items)

    def publish_many(items: list[tuple[Loaded, Release]]) -> list[Exception | None]:
        raise AssertionError("given publish_prepared, the sender sends through it")

    sender = OnTimeSender(publish_many, sent.append, lambda partition: True,
                          prepare_many=prepare_many, publish_prepared=publish_prepared)
    try:
        start = now_ms()
        items = [Sending(loaded(name, start + offset),
                         Release(TaskKey(name, start + offset, "u"), 0, 1, 1, 0), start + offset)
                 for name, offset in (("o-late", -50), ("o-ahead", 400), ("o-unbuilt", 300))]
        sender.hand(items)
        assert sender.settle([0], timeout=5.0)
        # built as soon as it was handed over, well before its due time; one already due is not
        assert {key.ordering_id for key, _ in built} == {"o-ahead", "o-unbuilt"}
        assert all(at < key.scheduled_ms - 100 for key, at in built)
        assert [(key.ordering_id, message) for key, message, _ in published] == [
            ("o-late", None), ("o-unbuilt", None), ("o-ahead", "message of o-ahead")]
        assert all(at >= key.scheduled_ms for key, _, at in published)
        assert [error for event in sent for _, error in event.results] == [None, None, None]
    finally:
        sender.stop()


def test_a_message_that_could_not_be_built_ahead_is_built_when_sent() -> None:
    published: list[object] = []

    def prepare_many(items: list[tuple[Loaded, Release]]) -> list[object]:
        raise RuntimeError("the broker's connection went away")

    def publish_prepared(items: list[tuple[Loaded, Release]], prepared: list[object]
                         ) -> list[Exception | None]:
        published.extend(prepared)
        return [None] * len(items)

    sender = OnTimeSender(lambda items: [None] * len(items), lambda event: None, lambda partition: True,
                          prepare_many=prepare_many, publish_prepared=publish_prepared)
    try:
        due = now_ms() + 200
        sender.hand([Sending(loaded("o", due), Release(TaskKey("o", due, "u"), 0, 1, 1, 0), due)])
        assert sender.settle([0], timeout=5.0)
        assert published == [None]
    finally:
        sender.stop()


def test_preparing_needs_its_publish() -> None:
    with pytest.raises(ValueError, match="go together"):
        OnTimeSender(lambda items: [], lambda event: None, lambda partition: True,
                     prepare_many=lambda items: [])


class LateConfirms:
    """A broker that confirms each release only when the test says so (RabbitMQ's confirms)."""

    def __init__(self) -> None:
        self.published: list[tuple[str, int]] = []  # ordering id, when (ms)
        self.waiting: dict[str, Unconfirmed] = {}
        self.answer: dict[str, Exception | None] = {}  # settled at the next read of confirms
        self.reads = 0

    def publish_prepared(self, items: list[tuple[Loaded, Release]], prepared: list[object]
                         ) -> list[Exception | Unconfirmed | None]:
        results: list[Exception | Unconfirmed | None] = []
        for task, _ in items:
            self.published.append((task.key.ordering_id, now_ms()))
            results.append(self.waiting.setdefault(task.key.ordering_id, Unconfirmed(time.monotonic())))
        return results

    def confirm(self, timeout: float) -> None:
        self.reads += 1
        for name, result in list(self.answer.items()):
            self.waiting.pop(name).settle(result)
            del self.answer[name]
        time.sleep(min(timeout, 0.001))


def test_a_release_due_while_an_earlier_one_awaits_its_confirm_is_sent_on_time_and_reported_after_it(
) -> None:
    broker = LateConfirms()
    sent: list[Sent] = []
    sender = OnTimeSender(lambda items: [], sent.append, lambda partition: True,
                          prepare_many=lambda items: [None] * len(items),
                          publish_prepared=broker.publish_prepared, confirm=broker.confirm)
    try:
        start = now_ms()
        sender.hand([Sending(loaded(name, start + offset), Release(TaskKey(name, start + offset, "u"),
                                                                   0, 1, 1, 0), start + offset)
                     for name, offset in (("first", 50), ("second", 150), ("third", 250))])
        wait_until(lambda: len(broker.published) == 3, 5, every=0.005)
        # each went at its due time, though none of them has been confirmed (the first is
        # not, until the test says so)
        assert all(at >= start + offset for (_, at), offset in zip(broker.published, (50, 150, 250),
                                                                   strict=True))
        assert sent == [] and not sender.settle([0], timeout=0.05)
        broker.answer["second"] = None  # confirmed first: reported only after the first
        broker.answer["third"] = ReleaseNotSentError("refused")
        wait_until(lambda: not broker.answer, 5, every=0.005)
        time.sleep(0.05)
        assert sent == []
        broker.answer["first"] = None
        assert sender.settle([0], timeout=5.0)
        reported = [(item.task.key.ordering_id, error) for event in sent for item, error in event.results]
        assert [name for name, _ in reported] == ["first", "second", "third"]
        assert reported[0][1] is None and reported[1][1] is None
        assert isinstance(reported[2][1], ReleaseNotSentError)
        assert broker.reads > 3  # read while it waited for the next due time
    finally:
        sender.stop()


def test_a_stopping_sender_reports_the_releases_never_confirmed_as_uncertain() -> None:
    broker = LateConfirms()
    sent: list[Sent] = []
    sender = OnTimeSender(lambda items: [], sent.append, lambda partition: True,
                          prepare_many=lambda items: [None] * len(items),
                          publish_prepared=broker.publish_prepared, confirm=broker.confirm)
    due = now_ms()
    sender.hand([Sending(loaded("o", due), Release(TaskKey("o", due, "u"), 0, 1, 1, 0), due)])
    wait_until(lambda: len(broker.published) == 1, 5, every=0.005)
    stop_started = time.monotonic()
    sender.stop(timeout=10.0)
    assert time.monotonic() - stop_started < 5.0
    [(_, error)] = [result for event in sent for result in event.results]
    assert isinstance(error, ReleaseUncertainError)  # it may have reached the broker
