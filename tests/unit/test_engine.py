"""The release engine against the in-memory store, driven step by step with a fake clock."""

from __future__ import annotations

import threading
import time
import types
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from celery_scheduler.clock import FakeClock as Clock
from celery_scheduler.dispatcher import pace as pace_module
from celery_scheduler.dispatcher.engine import Engine, EngineSettings
from celery_scheduler.dispatcher.timetable import Loaded
from celery_scheduler.envelope import RetryPolicy, ScheduleEnvelope
from celery_scheduler.errors import ReleaseNotSentError, ReleaseUncertainError, StoreUnavailableError
from celery_scheduler.keys import TaskKey
from celery_scheduler.metrics import PrometheusMetrics
from celery_scheduler.store.base import Cancel, Cursor, State, StoredTask, bucket_of
from celery_scheduler.store.memory import MemoryScheduleStore
from celery_scheduler.wire import Beat, Outcome, OutcomeBatch, Release
from tests.unit.fakes import NOW, OutageStore, leased_engine


@pytest.fixture
def clock() -> Clock:
    return Clock(NOW)


@pytest.fixture
def store() -> MemoryScheduleStore:
    return MemoryScheduleStore()


class Harness:
    def __init__(self, store: MemoryScheduleStore, clock: Clock,
                 switch_interval: Callable[[float], None] | None = None, **settings: object) -> None:
        self.store = store
        self.clock = clock
        self.released: list[tuple[TaskKey, int]] = []
        self.releases: dict[TaskKey, Release] = {}  # the last release of each key
        self.registry = CollectorRegistry()
        self.engine = Engine(store, self.publish, "owner-1",
                             EngineSettings(**{"tick_seconds": 0, "outcome_poll_seconds": 1.0, **settings}),
                             clock=clock, metrics=PrometheusMetrics(self.registry),
                             switch_interval=switch_interval)
        self.engine.assign([0])

    def sample(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)

    def publish(self, task: Loaded, release: Release) -> None:
        self.released.append((task.key, release.attempt))
        self.releases[task.key] = release

    def beat(self, key: TaskKey, offset: int = 0, release: Release | None = None) -> None:
        """The worker of *key*'s last release (or of *release*) says it is running."""
        r = release or self.releases[key]
        self.engine.outcomes(OutcomeBatch([], {0: offset + 1}, beats=[
            Beat(key, 0, r.attempt, r.lease_until_ms, self.clock(), self.clock(), r.run_lease_ms,
                 offset)]))

    def schedule(self, ordering_id: str, offset_ms: int, unique: str = "u", attempts: int = 3) -> TaskKey:
        envelope = ScheduleEnvelope(TaskKey(ordering_id, NOW + offset_ms, unique), "t",
                                    retry=RetryPolicy(attempts, 1.0, 10.0))
        stored = self.store.put(0, envelope, self.clock())
        assert stored is not None
        self.engine.persisted(stored)
        return envelope.key

    def step(self, advance_ms: int = 0) -> None:
        self.clock.ms += advance_ms
        self.engine.step()

    def report(self, key: TaskKey, attempt: int, ok: bool) -> None:
        self.store.record_outcome(0, key, attempt, ok, None if ok else "boom", self.clock())
        self.engine.outcome(Outcome(key, 0, attempt, ok, None if ok else "boom"))


def test_releases_when_due_and_next_after_completion(store: MemoryScheduleStore, clock: Clock) -> None:
    h = Harness(store, clock)
    first, second = h.schedule("a", 100), h.schedule("a", 200)
    h.step()
    assert h.released == []  # not due yet
    h.step(250)
    assert h.released == [(first, 1)]  # second waits for first
    h.report(first, 1, True)
    h.step()
    assert h.released == [(first, 1), (second, 1)]
    assert store.status(first).state is State.SUCCEEDED


def test_release_lateness_is_the_release_time_minus_the_due_time(store: MemoryScheduleStore,
                                                                  clock: Clock) -> None:
    h = Harness(store, clock)
    h.schedule("a", 100)
    h.step(350)  # released 250 ms after it fell due
    assert h.sample("celery_scheduler_release_lateness_seconds_count") == 1
    assert h.sample("celery_scheduler_release_lateness_seconds_sum") == pytest.approx(0.25)


def test_the_switch_interval_is_long_while_releases_are_late_and_short_once_on_time(
        store: MemoryScheduleStore, clock: Clock) -> None:
    intervals: list[float] = []
    h = Harness(store, clock, switch_interval=intervals.append)
    h.schedule("a", 100)
    h.step(100 + 5000)  # released five seconds after it fell due: a backlog
    assert intervals == [pace_module.BEHIND_SWITCH_INTERVAL]
    h.schedule("b", 5100 + 500)
    h.step(200)  # nothing due: on time again
    assert intervals == [pace_module.BEHIND_SWITCH_INTERVAL, pace_module.ON_TIME_SWITCH_INTERVAL]
    h.step(300 + 20)  # released 20 ms late: still on time
    assert h.released[-1][0].ordering_id == "b"
    assert intervals == [pace_module.BEHIND_SWITCH_INTERVAL, pace_module.ON_TIME_SWITCH_INTERVAL]


def test_a_finished_task_records_its_first_release_and_the_run_the_worker_reported(
        store: MemoryScheduleStore, clock: Clock) -> None:
    h = Harness(store, clock)
    key = h.schedule("a", 100, attempts=2)
    h.step(150)
    released = clock.ms
    h.engine.outcome(Outcome(key, 0, 1, False, "boom", released + 5, released + 7))
    h.step()
    h.step(2000)  # retried
    assert h.released == [(key, 1), (key, 2)]
    h.engine.outcome(Outcome(key, 0, 2, True, None, clock.ms + 3, clock.ms + 4))
    h.step()
    status = store.status(key)
    assert (status.state, status.released_ms) == (State.SUCCEEDED, released)
    assert (status.started_ms, status.finished_ms) == (released + 2000 + 3, released + 2000 + 4)


def test_outcomes_carry_run_times_and_read_those_of_earlier_workers() -> None:
    outcome = Outcome(TaskKey("a", NOW, "u"), 3, 1, True, None, NOW + 1, NOW + 2)
    assert Outcome.decode(outcome.encode()) == outcome
    older = b'{"o":"a","t":%d,"u":"u","p":3,"a":1,"s":true,"x":null}' % NOW
    assert Outcome.decode(older) == Outcome(TaskKey("a", NOW, "u"), 3, 1, True, None)


def test_failure_retries_with_backoff_then_gives_up(store: MemoryScheduleStore, clock: Clock) -> None:
    h = Harness(store, clock)
    key = h.schedule("a", 0, attempts=2)
    h.step()
    h.report(key, 1, False)
    h.step()
    assert h.released == [(key, 1)]
    assert store.status(key).state is State.PENDING  # retry pending
    h.step(1000)  # backoff 1 s * jitter(0.5..1) has passed
    assert h.released == [(key, 1), (key, 2)]
    h.report(key, 2, False)
    h.step()
    status = store.status(key)
    assert (status.state, status.attempts, status.last_error) == (State.FAILED, 2, "boom")
    assert h.sample("celery_scheduler_released_total") == 2
    assert h.sample("celery_scheduler_retries_total") == 1
    assert h.sample("celery_scheduler_finished_total", outcome="failed") == 1
    assert h.sample("celery_scheduler_in_flight_tasks") == 0


def retried(h: Harness, key: TaskKey) -> None:
    """What the ingest loop does with a retry record of *key*."""
    stored = h.store.retry(0, key, h.clock())
    assert stored is not None
    h.engine.persisted(stored)


def test_a_blocked_ordering_id_retried_runs_the_task_once_more_then_moves_on(
        store: MemoryScheduleStore, clock: Clock) -> None:
    h = Harness(store, clock, on_exhausted="block")
    key, later = h.schedule("a", 0, attempts=1), h.schedule("a", 10)
    h.step()
    h.report(key, 1, False)
    h.step(100)
    assert h.released == [(key, 1)]  # blocked: the later task waits
    assert store.status(key).state is State.FAILED
    retried(h, key)
    h.step()
    assert h.released == [(key, 1), (key, 2)]  # one more attempt, counted on
    h.report(key, 2, True)
    h.step()
    assert h.released == [(key, 1), (key, 2), (later, 1)]
    assert store.status(key).state is State.SUCCEEDED


def test_a_retried_attempt_that_fails_blocks_again(store: MemoryScheduleStore, clock: Clock) -> None:
    h = Harness(store, clock, on_exhausted="block")
    key, later = h.schedule("a", 0, attempts=2), h.schedule("a", 10)
    for attempt, wait in ((1, 0), (2, 1000)):
        h.step(wait)
        h.report(key, attempt, False)
        h.step()
    retried(h, key)
    h.step()
    h.report(key, 3, False)
    h.step(5000)
    assert h.released == [(key, 1), (key, 2), (key, 3)]
    status = store.status(key)
    assert (status.state, status.attempts) == (State.FAILED, 3)
    assert later not in [k for k, _ in h.released]


def test_a_failed_task_that_was_given_up_runs_again_when_retried(
        store: MemoryScheduleStore, clock: Clock) -> None:
    h = Harness(store, clock)  # on_exhausted="skip"
    key = h.schedule("a", 0, attempts=1)
    h.step()
    h.report(key, 1, False)
    h.step()
    assert key not in h.engine.timetable and store.status(key).state is State.FAILED
    h.step(60_000)
    retried(h, key)
    h.step()
    assert h.released == [(key, 1), (key, 2)]
    h.report(key, 2, True)
    h.step()
    assert store.status(key).state is State.SUCCEEDED


def test_stale_outcomes_are_ignored(store: MemoryScheduleStore, clock: Clock) -> None:
    h = Harness(store, clock)
    key = h.schedule("a", 0)
    h.step()
    h.engine.outcome(Outcome(key, 0, 7, True, None))  # not the attempt in flight
    h.step()
    assert store.status(key).state is State.RELEASED


def test_an_outcome_stored_elsewhere_is_found_when_the_lease_ends(
        store: MemoryScheduleStore, clock: Clock) -> None:
    """An outcome that reached the store but not this engine (recorded by another reader)
    is found when the task's lease ends: the task is finished, not released again."""
    h = Harness(store, clock, lease_seconds=10.0)
    first, second = h.schedule("a", 0), h.schedule("a", 1)
    h.step()
    store.record_outcome(0, first, 1, True, None, clock())
    for _ in range(9):
        h.step(1000)
    assert h.released == [(first, 1)]  # no store reads for it before its lease ends
    for _ in range(3):
        h.step(1000)
    assert h.released == [(first, 1), (second, 1)]
    assert store.status(first).state is State.SUCCEEDED  # type: ignore[union-attr]


def test_a_release_never_heard_of_is_sent_again_with_the_same_attempt_once_its_start_lease_ends(
        store: MemoryScheduleStore, clock: Clock) -> None:
    # the broker lost it, or a worker took it and died before it started: no beat, no outcome
    h = Harness(store, clock, start_lease_seconds=8.0)
    key = h.schedule("a", 0)
    h.step()
    first = h.releases[key]
    assert first.lease_until_ms == NOW + 8_000 and first.run_lease_ms == 20_000
    for _ in range(21):  # the start lease, and the longest a first beat may take (3 s)
        h.step(500)
    assert h.released == [(key, 1)]
    for _ in range(2):
        h.step(500)
    assert h.released == [(key, 1), (key, 1)]  # no attempt spent, no backoff
    assert h.releases[key].lease_until_ms > first.lease_until_ms  # a new release of it


def test_a_step_of_releases_lost_together_is_one_warning_line_and_an_info_line_each(
        store: MemoryScheduleStore, clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    # a broker restart loses a whole step of releases: one event, not a WARNING line a task
    h = Harness(store, clock, start_lease_seconds=8.0)
    keys = [h.schedule(f"o{n}", 0) for n in range(7)]
    h.step()
    assert len(h.released) == 7
    caplog.set_level("INFO", "celery_scheduler.dispatcher.engine")
    for _ in range(23):
        h.step(500)
    assert sorted(h.released) == sorted([(key, 1) for key in keys] * 2)  # each sent again
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, warnings
    head = "7 task(s) did not start within their start lease; releasing them again: "
    assert warnings[0].startswith(head) and warnings[0].endswith(" and 4 more")
    named = warnings[0][len(head):-len(" and 4 more")].split(", ")
    assert len(named) == 3 and set(named) <= {str(key) for key in keys}
    each = [r for r in caplog.records if r.levelname == "INFO" and "did not start" in r.getMessage()]
    assert sorted(r.args[0] for r in each) == sorted(keys)  # type: ignore[index]


def test_a_task_that_beats_runs_past_its_run_lease_and_is_not_released_again(
        store: MemoryScheduleStore, clock: Clock) -> None:
    h = Harness(store, clock, lease_seconds=10.0)
    key = h.schedule("a", 0)
    later = h.schedule("a", 1, "later")
    h.step()
    for second in range(120):  # two minutes, twelve run leases
        h.step(1000)
        h.beat(key, second)
    assert h.released == [(key, 1)]
    h.report(key, 1, True)
    h.step()
    h.step(1000)
    assert h.released == [(key, 1), (later, 1)]


def test_a_task_whose_beats_stop_is_released_again_as_its_next_attempt(
        store: MemoryScheduleStore, clock: Clock) -> None:
    h = Harness(store, clock, lease_seconds=20.0)
    key = h.schedule("a", 0)
    h.step()
    for second in range(5):
        h.step(1000)
        h.beat(key, second)
    last_beat = clock()
    while (key, 2) not in h.released and clock() - last_beat < 40_000:
        h.step(500)
    # the run lease and the 2.5 s a beat may take, then the first retry's backoff (<= 1 s)
    assert 20_000 + 2_500 <= clock() - last_beat <= 20_000 + 2_500 + 1_500
    status = store.status(key)
    assert status is not None and "no beat from its worker" in (status.last_error or "")


def test_a_beat_of_an_earlier_release_of_the_attempt_does_not_count(
        store: MemoryScheduleStore, clock: Clock) -> None:
    h = Harness(store, clock)
    key = h.schedule("a", 0)
    h.step()
    stale = h.releases[key]
    for _ in range(22):
        h.step(500)
    assert h.released == [(key, 1), (key, 1)]  # sent again: the first was not heard of
    h.beat(key, release=stale)  # a copy of the first one turns up
    h.engine.outcome(Outcome(key, 0, 1, True, None, generation=stale.lease_until_ms))
    h.step(1000)
    status = store.status(key)
    assert status is not None and status.state is State.RELEASED  # not finished by it
    h.engine.outcome(Outcome(key, 0, 1, True, None, generation=h.releases[key].lease_until_ms))
    h.step(1000)
    status = store.status(key)
    assert status is not None and status.state is State.SUCCEEDED


def test_outcome_commits_stop_at_the_latest_beat_of_a_running_task(
        store: MemoryScheduleStore, clock: Clock) -> None:
    """So that the partition's next owner reads it again, and knows the task is running."""
    h = Harness(store, clock)
    running, short = h.schedule("a", 0), h.schedule("b", 0)
    h.step()
    h.beat(running, offset=3)
    h.engine.outcomes(OutcomeBatch([Outcome(short, 0, 1, True, None)], {0: 5}))
    h.step(1000)
    assert h.engine.durable_outcome_offsets() == {0: 3}
    h.beat(running, offset=7)
    h.step(1000)
    assert h.engine.durable_outcome_offsets() == {0: 7}
    h.engine.outcomes(OutcomeBatch([Outcome(running, 0, 1, True, None)], {0: 9}))
    h.step(1000)
    assert h.engine.durable_outcome_offsets() == {0: 9}  # finished: nothing holds them back


def previous_owners_release(store: MemoryScheduleStore) -> ScheduleEnvelope:
    """A task another dispatcher marked released at NOW, with the default start lease."""
    envelope = ScheduleEnvelope(TaskKey("a", NOW, "u"), "t")
    stored = store.put(0, envelope, NOW)
    assert stored is not None
    store.mark_released(stored, 1, NOW + 8_000, NOW)
    return envelope


def test_a_previous_owners_task_heard_before_it_is_loaded_is_not_released_again(
        store: MemoryScheduleStore, clock: Clock) -> None:
    envelope = previous_owners_release(store)
    h = Harness(store, clock)
    previous = Release(envelope.key, 0, 1, 1, NOW + 8_000, NOW, 20_000)
    h.beat(envelope.key, offset=4, release=previous)  # read before the partition is loaded
    for second in range(60):
        h.step(1000)
        h.beat(envelope.key, offset=5 + second, release=previous)
    assert h.released == []  # running all along
    assert h.engine.durable_outcome_offsets()[0] <= 5 + 59
    for _ in range(30):  # its worker died
        h.step(1000)
    assert h.released == [(envelope.key, 2)]


def test_a_previous_owners_release_never_heard_of_is_sent_again_with_the_same_attempt(
        store: MemoryScheduleStore, clock: Clock) -> None:
    envelope = previous_owners_release(store)  # marked, then its owner died before it sent it
    h = Harness(store, clock)
    for _ in range(10):
        h.step(1000)
    assert h.released == []
    for _ in range(2):
        h.step(1000)
    assert h.released == [(envelope.key, 1)]


def test_task_left_in_flight_by_a_previous_owner_blocks_until_its_outcome(
        store: MemoryScheduleStore, clock: Clock) -> None:
    # a previous dispatcher released "first" and died; its lease runs for another minute
    envelope = ScheduleEnvelope(TaskKey("a", NOW, "u"), "t")
    stored = store.put(0, envelope, NOW)
    store.mark_released(stored, 1, NOW + 60_000, NOW)
    h = Harness(store, clock)
    second = h.schedule("a", 10)
    h.step(100)
    h.step()
    assert h.released == []  # the ordering id waits for the adopted task
    h.report(envelope.key, 1, True)  # its worker reports: the new owner accepts it
    h.step()
    assert h.released == [(second, 1)]


def test_no_release_without_the_partition_lease(store: MemoryScheduleStore, clock: Clock) -> None:
    other = store.acquire_lease(0, "someone-else", 60_000, NOW)
    assert other is not None
    h = Harness(store, clock)
    h.schedule("a", 0)
    for _ in range(5):
        h.step(100)
    assert h.released == []
    store.release_lease(other)
    h.engine.partitions[0].next_attempt_mono = 0
    h.step()
    h.step()
    assert len(h.released) == 1


def test_cancel_removes_a_loaded_task(store: MemoryScheduleStore, clock: Clock) -> None:
    h = Harness(store, clock)
    key = h.schedule("a", 1000)
    h.step()
    store.cancel(0, key, clock())
    h.engine.cancelled(key)
    h.step(2000)
    assert h.released == []


def test_a_cancel_whose_status_cannot_be_read_holds_its_task_until_the_store_answers(
        store: MemoryScheduleStore, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cancel was written, but the engine's read of the status behind it timed out.

    Found on a replicated cluster with a stalled Cassandra node: the hold on the key was
    lifted all the same, the task was released at its due time and ran though cancelled.
    """
    h = Harness(store, clock)
    key = h.schedule("a", 1000)
    h.step()
    with h.engine.claims.ingesting([Cancel(0, key)]):
        assert store.cancel(0, key, clock())
    answers = store.status
    outage = [True]

    def status(k: TaskKey) -> object:
        if outage[0]:
            raise StoreUnavailableError("read timed out")
        return answers(k)

    monkeypatch.setattr(store, "status", status)
    h.engine.cancelled(key)
    for _ in range(5):
        h.step(1000)
    assert h.released == [] and key in h.engine.timetable  # held, not dropped on a guess
    outage[0] = False
    h.step(1000)
    assert h.released == [] and key not in h.engine.timetable
    assert h.engine.claims.unsettled_cancels() == 0


def test_a_cancel_overwritten_by_a_release_marked_before_it_does_not_lose_the_task(
        store: MemoryScheduleStore, clock: Clock) -> None:
    """The cancel landed between the engine marking the task released and publishing it.

    Found by the chaos harness: the key ended "released", never published, never run.
    """
    h = Harness(store, clock)
    key = h.schedule("a", 1000)
    h.step()
    stored = h.engine.timetable.get(key)
    assert stored is not None
    assert store.cancel(0, key, clock())  # the cancel lands first...
    store.mark_released(stored.stored, 1, clock() + 60_000, clock())  # ...then the marking
    h.engine.cancelled(key)
    h.step(2000)
    assert [k for k, _ in h.released] == [key]


def test_a_released_task_settled_as_cancelled_is_not_released_again(
        store: MemoryScheduleStore, clock: Clock) -> None:
    """Another dispatcher's ingest cancelled the task just before this engine marked it.

    The marking overwrote the cancel and left a row without its task; a reader of that row
    settled the key as cancelled. The engine must let the ordering id move on, not release
    the task again when its lease runs out.
    """
    h = Harness(store, clock, lease_seconds=10.0)
    first, second = h.schedule("a", 1000), h.schedule("a", 1001)
    h.step()
    assert store.cancel(0, first, clock())  # not told to this engine: another process applied it
    h.step(2000)
    assert h.released == [(first, 1)]
    assert store.read(0, Cursor(bucket_of(NOW, store.bucket_seconds)), 10)[0].key == second
    assert store.status(first).state is State.CANCELLED  # type: ignore[union-attr]
    for _ in range(11):  # its poll when its lease ends finds the cancel
        h.step(1000)
    assert h.released == [(first, 1), (second, 1)]
    h.report(second, 1, True)
    for _ in range(30):
        h.step(1000)
    assert h.released == [(first, 1), (second, 1)]  # and the first is not released again


def test_memory_is_bounded_per_partition(store: MemoryScheduleStore, clock: Clock) -> None:
    h = Harness(store, clock, max_loaded=10, page_size=4)
    for i in range(50):
        h.schedule(f"o{i}", i)
    h.step()
    assert h.engine.timetable.count(0) <= 10
    for _ in range(20):  # drain: everything runs eventually, oldest first
        for key, attempt in h.released[-10:]:
            if store.status(key).state is State.RELEASED:
                h.report(key, attempt, True)
        h.step(100)
        assert h.engine.timetable.count(0) <= 10
    assert len({k for k, _ in h.released}) == 50


def test_broker_outage_at_release_is_retried_without_spending_an_attempt(
        store: MemoryScheduleStore, clock: Clock) -> None:
    h = Harness(store, clock)
    failures = [ReleaseNotSentError("broker down")]

    def flaky_publish(task: Loaded, release: Release) -> None:
        if failures:
            raise failures.pop()
        h.released.append((task.key, release.attempt))

    h.engine.publish = flaky_publish
    key = h.schedule("a", 0)
    h.step()
    assert h.released == [] and store.status(key).state is State.PENDING
    h.step(1000)
    assert h.released == [(key, 1)]  # first real release is attempt 1


def _failing_batches(h: Harness, error: Exception) -> list[list[tuple[TaskKey, int]]]:
    """Make the first batch *h*'s engine publishes fail with *error*; return every batch."""
    batches: list[list[tuple[TaskKey, int]]] = []

    def publish_many(items: list[tuple[Loaded, Release]]) -> list[Exception | None]:
        batches.append([(task.key, release.attempt) for task, release in items])
        return [error if len(batches) == 1 else None] * len(items)

    h.engine.publish_many = publish_many
    return batches


def test_a_batch_the_broker_certainly_did_not_take_is_released_again_whole(
        store: MemoryScheduleStore, clock: Clock) -> None:
    h = Harness(store, clock)
    batches = _failing_batches(h, ReleaseNotSentError("connection refused"))
    keys = [h.schedule(f"o{i}", 0) for i in range(3)] + [h.schedule("o0", 10, "later")]
    h.step()
    assert batches == [[(k, 1) for k in keys[:3]]]  # one batch per step, a key per ordering id
    assert [store.status(k).state for k in keys[:3]] == [State.PENDING] * 3
    assert h.sample("celery_scheduler_released_total") == 0
    h.step(500)
    assert len(batches) == 1  # not before a second has passed
    h.step(500)
    assert batches[1] == [(k, 1) for k in keys[:3]]  # again, the attempt not spent
    assert [store.status(k).state for k in keys[:3]] == [State.RELEASED] * 3
    assert h.sample("celery_scheduler_released_total") == 3
    h.report(keys[0], 1, True)
    h.step()
    assert batches[2] == [(keys[3], 1)]  # the ordering id goes on once its head succeeded


def test_a_batch_the_broker_may_have_taken_stays_released_until_its_outcome_or_lease_end(
        store: MemoryScheduleStore, clock: Clock) -> None:
    # Sent again at once, it could run twice side by side, and the first copy's outcome
    # would free the ordering id while the second still ran.
    h = Harness(store, clock, lease_seconds=10.0)
    batches = _failing_batches(h, ReleaseUncertainError("connection lost while sending"))
    first, later = h.schedule("a", 0), h.schedule("a", 10, "later")
    other = h.schedule("b", 0)
    h.step()
    assert batches == [[(first, 1), (other, 1)]]
    assert [store.status(k).state for k in (first, other)] == [State.RELEASED] * 2
    h.step(5000)
    assert len(batches) == 1  # no second copy while the first may still run
    h.report(first, 1, True)  # the broker had it after all
    h.step()
    assert batches[1] == [(later, 1)]
    h.step(6100)  # the other's start lease and 3 s ended, unheard of: the broker lost it
    assert batches[2] == [(other, 1)]  # the same attempt, sent again


def test_after_a_failed_publish_the_rest_of_the_step_is_not_tried(
        store: MemoryScheduleStore, clock: Clock) -> None:
    h = Harness(store, clock)
    tried: list[TaskKey] = []

    def publish(task: Loaded, release: Release) -> None:
        tried.append(task.key)
        if len(tried) == 2:
            raise RuntimeError("broker down")
        h.released.append((task.key, release.attempt))

    h.engine.publish = publish
    keys = [h.schedule(f"o{i}", 0) for i in range(3)]
    h.step()
    assert tried == keys[:2] and h.released == [(keys[0], 1)]
    # the one that failed may have been sent: it stays released; the rest were not tried
    assert [store.status(k).state for k in keys] == [State.RELEASED, State.RELEASED, State.PENDING]
    h.step(1000)
    assert sorted(h.released) == sorted([(keys[0], 1), (keys[2], 1)])


class _RecordingStore(MemoryScheduleStore):
    """Notes the store round trips that stand between a due time and a release."""

    def __init__(self, calls: list[str]) -> None:
        super().__init__()
        self.calls = calls

    def acquire_leases(self, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        self.calls.append("acquire_leases")
        return super().acquire_leases(*args, **kwargs)  # type: ignore[arg-type]

    def renew_leases(self, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        self.calls.append("renew_leases")
        return super().renew_leases(*args, **kwargs)  # type: ignore[arg-type]

    def read(self, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        self.calls.append("read")
        return super().read(*args, **kwargs)  # type: ignore[arg-type]

    def buckets(self, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        self.calls.append("buckets")
        return super().buckets(*args, **kwargs)  # type: ignore[arg-type]

    def finish_many(self, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        self.calls.append("finish_many")
        return super().finish_many(*args, **kwargs)  # type: ignore[arg-type]

    def mark_released_and_succeeded(self, releases, succeeded, now_ms, runs=None):  # type: ignore[no-untyped-def]
        self.calls.append(f"released {','.join(t.key.ordering_id for t, _, _ in releases)}"
                          f" succeeded {','.join(t.key.ordering_id for t in succeeded)}")
        MemoryScheduleStore.mark_released_many(self, releases, now_ms)
        MemoryScheduleStore.finish_many(self, succeeded, State.SUCCEEDED, now_ms, runs)


def test_a_due_task_is_released_before_the_step_renews_leases_and_reads_the_schedule(
        clock: Clock) -> None:
    calls: list[str] = []
    store = _RecordingStore(calls)
    h = Harness(store, clock)
    h.publish = lambda task, release: calls.append("publish")  # type: ignore[method-assign]
    h.engine.publish = h.publish
    h.schedule("a", 100)
    h.step()  # leased and loaded; not due yet
    partition = h.engine.partitions[0]
    partition.lease_mono -= 4.0  # the lease wants renewing (but is still certain) ...
    partition.loader.dirty = True  # ... and the schedule wants reading
    calls.clear()
    h.step(150)
    assert calls[:2] == ["released a succeeded ", "publish"], calls  # its marking, then itself
    assert "renew_leases" in calls and "read" in calls


def test_leases_are_taken_and_renewed_all_at_once(clock: Clock) -> None:
    calls: list[str] = []
    store = _RecordingStore(calls)
    h = Harness(store, clock)
    h.engine.assign([1, 2, 3])
    h.step()
    assert calls.count("acquire_leases") == 1  # all four partitions, one request
    assert [lease.partition for lease in store.leases()] == [0, 1, 2, 3]
    h.engine.partitions[2].lease_mono -= 2.5  # one lease wants renewing (a third of 6 s) ...
    calls.clear()
    h.step()
    assert calls.count("renew_leases") == 1  # ... and every lease goes with it
    renewed = {n: p.lease_mono for n, p in h.engine.partitions.items()}
    assert len(set(renewed.values())) == 1, renewed
    # one lease taken meanwhile by another dispatcher is dropped; the others are kept
    taken = store.leases()[3]
    store.release_lease(taken)
    assert store.acquire_lease(3, "owner-2", 60_000, clock()) is not None
    h.engine.partitions[0].lease_mono -= 2.5
    h.step()
    assert [n for n, p in h.engine.partitions.items() if p.lease is not None] == [0, 1, 2]
    assert not h.engine.may_persist(3) and h.engine.may_persist(0)


def test_renewals_failing_through_an_outage_are_said_once_and_their_end_too(
        clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    store = OutageStore("renew_leases")
    h = Harness(store, clock)
    h.step()
    caplog.set_level("INFO", "celery_scheduler.dispatcher.engine")
    store.down = True
    for _ in range(20):
        h.engine.partitions[0].lease_mono -= 2.5  # due for renewal at every step
        h.step(100)
    failed = [r for r in caplog.records if "could not renew" in r.getMessage()]
    assert len(failed) == 1 and failed[0].levelname == "WARNING" and not failed[0].exc_info
    assert "down" in failed[0].getMessage()
    store.down = False
    h.engine.partitions[0].lease_mono -= 2.5
    h.step(100)
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("renewed")] == [
        "renewed the leases of partitions [0] again"]
    assert h.engine.partitions[0].lease is not None


class _NoWait(threading.Event):
    def wait(self, timeout: float | None = None) -> bool:
        return self.is_set()


def test_failed_steps_of_an_outage_are_logged_once_and_so_is_their_end(
        clock: Clock, store: MemoryScheduleStore, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    h = Harness(store, clock)
    caplog.set_level("INFO", "celery_scheduler.dispatcher.engine")
    outcomes: list[Exception | None] = [StoreUnavailableError("Cassandra is down")] * 30 + [None] * 3
    outcomes += [RuntimeError("a bug")] * 5 + [None, StoreUnavailableError("down again")]

    def step() -> None:
        outcome = outcomes.pop(0)
        if not outcomes:
            h.engine.stopped.set()
        if outcome is not None:
            raise outcome

    monkeypatch.setattr(h.engine, "step", step)
    monkeypatch.setattr(h.engine, "stopped", _NoWait())
    h.engine.run()
    lines = [(r.levelname, r.getMessage(), bool(r.exc_info)) for r in caplog.records
             if "step" in r.getMessage()]
    assert lines == [
        ("ERROR", "dispatcher step failed (Cassandra is down); retrying every 1s, and saying so "
                  "once it works again", False),
        ("WARNING", "dispatcher steps work again (StoreUnavailableError): they failed after "
                    f"{lines[1][1].split('after ')[1].split('s;')[0]}s; 29 repeated failure(s) "
                    "not shown", False),
        ("ERROR", "dispatcher step failed (a bug); retrying every 1s, and saying so once it "
                  "works again", True),  # not an outage: its traceback
        ("WARNING", lines[3][1], False),
        ("ERROR", "dispatcher step failed (down again); retrying every 1s, and saying so once "
                  "it works again", False),
    ]
    assert "4 repeated failure(s)" in lines[3][1]


def test_a_due_task_and_the_successes_of_the_step_are_written_in_one_round_trip(
        clock: Clock) -> None:
    calls: list[str] = []
    store = _RecordingStore(calls)
    h = Harness(store, clock)
    h.engine.publish = lambda task, release: calls.append(f"publish {task.key.ordering_id}")
    done, after = h.schedule("a", 0), h.schedule("a", 50, "next")
    h.schedule("b", 100)
    h.step()
    h.report(done, 1, True)
    calls.clear()
    h.step(150)
    # "b" waits for no other write than its own, which carries the success of "a"; "a"'s
    # next task waits for that success, and goes once it is written
    assert [c for c in calls if c != "read"] == [
        "released b succeeded a", "publish b", "released a succeeded ", "publish a"], calls
    assert store.status(done).state is State.SUCCEEDED
    assert h.engine.timetable.is_in_flight(after)


def test_in_a_full_window_the_successes_make_room_for_the_releases_that_carry_them(
        clock: Clock) -> None:
    """A backlog keeps the window full: the tasks that succeeded are still counted in flight
    until stored, yet the releases they make room for share their write."""
    calls: list[str] = []
    store = _RecordingStore(calls)
    h = Harness(store, clock, max_in_flight=2)
    keys = [h.schedule(f"id-{n}", n) for n in range(4)]
    h.step(10)
    assert [k for k, _ in h.released] == keys[:2]
    h.report(keys[0], 1, True)
    h.report(keys[1], 1, True)
    calls.clear()
    h.step()
    assert [c for c in calls if c != "read"] == ["released id-2,id-3 succeeded id-0,id-1"], calls
    assert [k for k, _ in h.released] == keys
    assert h.engine.timetable.in_flight_count() == 2  # still the window, no more
    assert store.status(keys[0]).state is State.SUCCEEDED  # type: ignore[union-attr]


def test_successes_linger_to_share_a_request_but_not_past_the_next_task_of_their_ordering_id(
        clock: Clock) -> None:
    calls: list[str] = []
    store = _RecordingStore(calls)
    h = Harness(store, clock, finish_linger_seconds=0.2)
    first, second = h.schedule("a", 0), h.schedule("b", 0)
    h.step()
    h.report(first, 1, True)
    h.step(50)
    h.report(second, 1, True)
    h.step(100)
    assert "finish_many" not in calls  # the first, read at 50 ms, has waited 100 ms of 200
    assert h.engine.timetable.is_in_flight(first)  # its ordering id is held meanwhile
    h.step(100)
    assert calls.count("finish_many") == 1  # both in one request
    assert store.status(first).state is State.SUCCEEDED  # type: ignore[union-attr]
    assert store.status(second).state is State.SUCCEEDED  # type: ignore[union-attr]
    # a success whose ordering id has a task due is stored in the step that reads it, so
    # that task goes at once
    third, after = h.schedule("c", 200), h.schedule("c", 260)
    h.step()
    h.report(third, 1, True)
    calls.clear()
    h.step(60)
    assert calls.count("finish_many") == 1
    assert h.engine.timetable.is_in_flight(after)


def test_a_task_written_within_what_is_loaded_needs_no_schedule_read(clock: Clock) -> None:
    calls: list[str] = []
    h = Harness(_RecordingStore(calls), clock)
    h.schedule("b", 200)
    h.step()  # leased, and read up to the horizon
    calls.clear()
    key = h.schedule("a", 300)  # ahead of the cursor, within the horizon
    h.step(300)
    assert h.released[-1] == (key, 1) and not {"read", "buckets"} & set(calls), calls


def test_a_task_beyond_the_horizon_is_read_when_the_horizon_reaches_it(clock: Clock) -> None:
    calls: list[str] = []
    h = Harness(_RecordingStore(calls), clock)
    h.step()
    calls.clear()
    key = h.schedule("a", 10 * 60_000)  # far ahead
    for _ in range(5):
        h.step(1000)
    assert calls == [] and key not in h.engine.timetable  # nothing to read yet
    h.step(10 * 60_000 - 5000)  # its bucket is now within the look-ahead
    assert key in h.engine.timetable
    h.step(5000)
    assert h.released == [(key, 1)]


def test_an_idle_partition_is_read_again_only_as_a_safety_net(clock: Clock) -> None:
    calls: list[str] = []
    h = Harness(_RecordingStore(calls), clock)
    clock.ms = bucket_of(NOW, 60) * 60_000 + 1000  # early in a bucket: the horizon stays put
    h.step()
    calls.clear()
    for _ in range(9):
        h.step(1000)
    assert calls == []  # nothing asked for a read within 9 s
    h.step(1000)
    assert calls == ["buckets"]  # the safety refresh (SAFETY_REFRESH_MS) finds no bucket


def test_a_task_written_ahead_while_a_read_is_owed_waits_for_it(clock: Clock) -> None:
    # No room for "a" at +600: a read is owed for it. Room comes back by a cancel, and then
    # "a" at +700 is written: loading it at once could release it before +600 is read.
    h = Harness(MemoryScheduleStore(), clock, max_loaded=1)
    other = h.schedule("x", 500)
    h.step()
    first = h.schedule("a", 600)
    h.step()
    assert first not in h.engine.timetable  # no room
    h.store.cancel(0, other, clock())
    h.engine.cancelled(other)
    h.schedule("a", 700)
    h.step(800)
    assert [key for key, _ in h.released] == [first]


class _IngestDuringRead(MemoryScheduleStore):
    """Runs *ingest* (once) when the engine next reads the schedule, as the ingest thread may."""

    def __init__(self) -> None:
        super().__init__()
        self.ingest: Callable[[], None] | None = None

    def read(self, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        ingest, self.ingest = self.ingest, None
        if ingest is not None:
            ingest()
        return super().read(*args, **kwargs)  # type: ignore[arg-type]


def test_a_task_read_by_a_fill_waits_for_an_earlier_one_known_only_by_its_event(
        clock: Clock) -> None:
    # Ingest writes "a" at +100 (behind the cursor, which is past "b" at +200) and then "a" at
    # +300 (ahead of it) while the step reads the schedule: the fill loads +300, and +100 is
    # known only by its queued event. Releasing +300 first would break the order.
    store = _IngestDuringRead()
    h = Harness(store, clock)
    h.schedule("b", 200)
    h.step()  # leased and loaded: the cursor is at "b"
    earlier = TaskKey("a", NOW + 100, "u")

    def ingest() -> None:
        h.schedule("a", 100)
        h.schedule("a", 300)

    store.ingest = ingest
    h.engine.partitions[0].loader.dirty = True
    h.step(400)
    assert [key for key, _ in h.released if key.ordering_id == "a"] == [earlier]


def test_a_store_outage_while_settling_an_adopted_task_does_not_block_its_ordering_id(
        clock: Clock) -> None:
    store = OutageStore("statuses", "status", "mark_retry")
    envelope = ScheduleEnvelope(TaskKey("a", NOW, "u"), "t", retry=RetryPolicy(5, 1.0, 10.0))
    stored = store.put(0, envelope, NOW)
    assert stored is not None
    store.mark_released(stored, 1, NOW - 3000, NOW - 11_000)  # a previous owner's, long over
    h = Harness(store, clock)
    store.down = True
    with pytest.raises(StoreUnavailableError):
        h.step(2000)  # loads it; its lease has run out: asked about its outcome, the store fails
    store.down = False
    for _ in range(5):
        h.step(500)
    assert h.released == [(envelope.key, 1)]  # never heard of: the same attempt again


def test_a_broker_and_store_outage_at_once_does_not_block_the_ordering_id(clock: Clock) -> None:
    store = OutageStore("statuses", "status", "mark_retry")
    h = Harness(store, clock)
    broker_down = [True]

    def publish(task: Loaded, release: Release) -> None:
        if broker_down[0]:
            raise ReleaseNotSentError("broker down")
        h.released.append((task.key, release.attempt))

    h.engine.publish = publish
    key = h.schedule("a", 100)
    h.step()  # loaded, not due
    store.down = True
    with pytest.raises(StoreUnavailableError):
        h.step(150)  # the publish fails, and so does recording the retry
    store.down, broker_down[0] = False, False
    for _ in range(4):
        h.step(500)
    assert h.released == [(key, 1)]


# --- outcomes from the outcomes topic, and flow control -------------------------------------


def _batch(outcomes: list[Outcome], offset: int) -> OutcomeBatch:
    return OutcomeBatch(outcomes, {0: offset})


def test_an_outcome_offset_is_durable_only_once_its_effect_is_stored(clock: Clock) -> None:
    """The reader may commit an outcome's offset only after the success it reports is
    recorded in the store: a dispatcher dying before that leaves it to be read again."""
    store = OutageStore("finish_many")
    h = Harness(store, clock)
    key = h.schedule("a", 0)
    h.step()
    store.down = True
    h.engine.outcomes(_batch([Outcome(key, 0, 1, True, None)], 41))
    with pytest.raises(StoreUnavailableError):
        h.step()
    assert h.engine.durable_outcome_offsets() == {}
    store.down = False
    h.step()
    assert store.status(key).state is State.SUCCEEDED  # type: ignore[union-attr]
    assert h.engine.durable_outcome_offsets() == {0: 41}


def test_a_failed_outcome_whose_retry_could_not_be_stored_holds_its_offset(clock: Clock) -> None:
    store = OutageStore("statuses", "status", "mark_retry")
    h = Harness(store, clock)
    key = h.schedule("a", 0)
    h.step()
    store.down = True
    h.engine.outcomes(_batch([Outcome(key, 0, 1, False, "boom")], 7))
    h.step()
    assert h.engine.durable_outcome_offsets() == {}
    store.down = False
    h.step()  # tried again a quarter of a second later, not at once
    assert store.status(key).last_error is None  # type: ignore[union-attr]
    h.step(250)
    assert store.status(key).attempts == 1  # type: ignore[union-attr]
    assert store.status(key).last_error == "boom"  # type: ignore[union-attr]
    assert h.engine.durable_outcome_offsets() == {0: 7}


def test_outcomes_the_store_keeps_refusing_are_tried_less_often_in_one_log_line_each(
        clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    store = OutageStore("statuses", "status", "mark_retry")
    h = Harness(store, clock)
    keys = [h.schedule(ordering_id, 0) for ordering_id in "abc"]
    h.step()
    store.down = True
    tried: list[int] = []
    mark_retry = store.mark_retry

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        tried.append(clock())
        return mark_retry(*args, **kwargs)

    store.mark_retry = counted  # type: ignore[method-assign]
    caplog.set_level("WARNING", "celery_scheduler.dispatcher.engine")
    h.engine.outcomes(_batch([Outcome(key, 0, 1, False, "boom") for key in keys], 9))
    start = clock()
    for _ in range(60):
        h.step(50)  # three seconds of steps
    rounds = sorted({ms - start for ms in tried})
    assert rounds == [50, 300, 800, 1800, 2800]  # 0.25 s, doubled, then every second
    refused = [r for r in caplog.records if "could not store the outcomes" in r.getMessage()]
    assert len(refused) == len(rounds)
    assert "of 3 task(s)" in refused[0].getMessage() and not refused[0].exc_info
    store.down = False
    h.step(1000)
    assert all(store.status(key).last_error == "boom" for key in keys)  # type: ignore[union-attr]
    assert h.engine.durable_outcome_offsets() == {0: 9}


def test_an_outcome_of_a_task_not_loaded_is_kept_in_the_store(store: MemoryScheduleStore,
                                                               clock: Clock) -> None:
    """A new owner may read an outcome before it loads its task: the store keeps it, and the
    task, loaded later as released by the previous owner, is finished from it."""
    h = Harness(store, clock)
    envelope = ScheduleEnvelope(TaskKey("elsewhere", NOW, "u"), "t")
    stored = store.put(0, envelope, clock())  # released twice by the previous owner
    assert stored is not None
    store.mark_released(stored, 2, NOW + 60_000, clock())
    key = envelope.key
    h.engine.outcomes(_batch([Outcome(key, 0, 2, True, None)], 3))
    h.step()
    status = store.status(key)
    assert status is not None and status.outcome == "succeeded" and status.outcome_attempt == 2
    assert h.engine.durable_outcome_offsets() == {0: 3}


def test_outcomes_of_unowned_partitions_are_neither_applied_nor_committed(
        store: MemoryScheduleStore, clock: Clock) -> None:
    h = Harness(store, clock)
    key = TaskKey("elsewhere", NOW, "u")
    h.engine.outcomes(OutcomeBatch([Outcome(key, 5, 1, True, None)], {5: 9}))
    h.step()
    assert store.status(key) is None
    assert h.engine.durable_outcome_offsets() == {}


def test_a_lease_end_while_the_outcome_reader_is_behind_does_not_release_again(
        store: MemoryScheduleStore, clock: Clock) -> None:
    h = Harness(store, clock, lease_seconds=10.0)
    key = h.schedule("a", 0)
    h.step()
    released_at = h.clock()
    read_until = [0]
    h.engine.hears(outcomes_read_until=lambda partition: read_until[0])
    for _ in range(20):
        h.step(1000)
    # its start lease (8 s) and the 3 s a first beat may take end 11 s after it
    read_until[0] = released_at + 10_000  # read up to a second before that
    for _ in range(3):
        h.step(1000)
    assert h.released == [(key, 1)]
    read_until[0] = released_at + 11_000  # read up to then: no beat, no outcome came
    for _ in range(3):
        h.step(1000)
    assert h.released == [(key, 1), (key, 1)]


def test_no_more_than_the_window_is_in_flight(store: MemoryScheduleStore, clock: Clock) -> None:
    h = Harness(store, clock, max_in_flight=2)
    keys = [h.schedule(f"id-{n}", n) for n in range(5)]
    h.step(10)
    assert [k for k, _ in h.released] == keys[:2]  # oldest first
    h.report(keys[0], 1, True)
    h.step()
    assert [k for k, _ in h.released] == keys[:3]


def test_the_window_follows_the_outcome_rate(store: MemoryScheduleStore, clock: Clock,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """With no fixed size, the window is at least its floor, and grows with the rate at which
    outcomes come back, so a fast pool of workers is never starved."""
    seconds = [1000.0]  # the engine's monotonic clock: the rate is measured over exactly 1 s
    monkeypatch.setattr(pace_module, "time", types.SimpleNamespace(
        monotonic=lambda: seconds[0], time_ns=time.time_ns))
    h = Harness(store, clock)
    for n in range(1000):
        h.schedule(f"id-{n}", 0)
    h.step()
    assert len(h.released) == 100  # the floor
    for key, attempt in h.released:
        h.report(key, attempt, True)
    h.step()
    assert len(h.released) == 200  # as many as came back
    seconds[0] += 1.0  # a second has passed since the window last measured
    for key, attempt in h.released[100:]:
        h.report(key, attempt, True)
    h.step()
    # 200 came back in about a second: the window is twice that rate, 100 of it in flight
    assert 380 <= len(h.released) <= 400


def test_an_earlier_task_that_finds_no_room_is_not_overtaken_by_a_later_one_loaded(
        store: MemoryScheduleStore, clock: Clock) -> None:
    h = Harness(store, clock, max_loaded=2)
    h.schedule("x", 50)
    later = h.schedule("y", 300, "3")
    h.step()  # both loaded: the partition is full, the cursor past them
    earlier = h.schedule("y", 100, "2")  # behind the cursor, and no room for it
    h.step(400)
    h.step()
    assert (later, 1) not in h.released and (earlier, 1) in h.released
    h.report(earlier, 1, True)
    h.step()
    h.step()
    assert h.released.index((earlier, 1)) < h.released.index((later, 1))


def test_a_previous_owners_release_that_succeeds_as_its_lease_ends_is_not_released_again(
        store: MemoryScheduleStore, clock: Clock) -> None:
    # Its success is applied at the start of the step and stored at the end of it: in
    # between, a head that is not in flight here would be taken again, and the store write
    # would then free its ordering id under the second copy.
    envelope = ScheduleEnvelope(TaskKey("a", NOW, "1"), "t", retry=RetryPolicy(5, 1.0, 10.0))
    stored = store.put(0, envelope, NOW)
    assert stored is not None
    store.mark_released(stored, 1, NOW + 1000, NOW)  # a previous owner's release
    h = Harness(store, clock)
    after = h.schedule("a", 10, "2")
    h.step()  # loaded, waiting for the outcome
    clock.ms = NOW + 1000  # the lease ends, and the outcome comes at last
    h.engine.outcome(Outcome(envelope.key, 0, 1, True, None))
    h.step()
    h.step()
    assert h.released == [(after, 1)]
    assert store.status(envelope.key).state is State.SUCCEEDED


def test_a_full_partition_is_read_again_a_page_at_a_time(store: MemoryScheduleStore,
                                                         clock: Clock) -> None:
    """A backlog larger than memory: each finished task frees a place, but the partition is
    read again once a page fits (or a second after the last read), not once per task."""
    h = Harness(store, clock, max_loaded=20, page_size=10)
    for i in range(100):  # written by an earlier owner: only a read finds them
        assert store.put(0, ScheduleEnvelope(TaskKey(f"o{i:03}", NOW + i, "u"), "t"), clock())
    reads: list[int] = []
    read = store.read

    def counted(*args: Any, **kwargs: Any) -> list[StoredTask]:
        rows = read(*args, **kwargs)
        reads.append(len(rows))
        return rows

    store.read = counted  # type: ignore[method-assign]
    h.step(1000)
    assert reads == [10, 10] and h.engine.timetable.count(0) == 20

    def finish(count: int) -> None:
        running = [(k, a) for k, a in h.released if store.status(k).state is State.RELEASED]
        for key, attempt in running[:count]:
            h.report(key, attempt, True)

    reads.clear()
    finish(4)
    for _ in range(3):
        h.step(100)  # successes stored, 4 places free: less than a page's worth (5)
    assert reads == []
    finish(1)
    h.step(100)
    h.step(100)
    assert reads == [5]  # the fifth freed place: one read of all five
    reads.clear()
    finish(2)
    h.step(100)
    h.step(100)
    assert reads == []
    h.step(1000)  # a second after the last read, the two places are filled anyway
    assert reads == [2]


def test_a_revocation_gives_every_partition_up_whatever_a_lease_release_raises(
        store: MemoryScheduleStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found on a replicated cluster: the first lease release raised an error the store had
    not typed, the revocation stopped half-way, and the other partition's lease was renewed
    for minutes while Kafka gave its records to another dispatcher."""
    engine = leased_engine(store, [0, 1])
    assert sorted(lease.partition for lease in store.leases() if lease.owner == "test") == [0, 1]
    give_up = store.release_lease

    def release_lease(lease: Any) -> None:
        if lease.partition == 0:
            raise RuntimeError("CAS operation result is unknown")
        give_up(lease)

    monkeypatch.setattr(store, "release_lease", release_lease)
    assert engine.revoke([0, 1])
    assert engine.partitions == {}
    assert {lease.partition: lease.expires_ms for lease in store.leases()}[1] == 0
    assert not engine.leases.certain(0) and not engine.leases.certain(1)
