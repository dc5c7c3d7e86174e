"""One contract for both schedule stores: the in-memory one and Cassandra.

The memory store backs unit tests and the testing helper, so it must behave exactly as the
real store; every case here runs against both.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from celery_scheduler.envelope import ScheduleEnvelope
from celery_scheduler.errors import SchemaMissingError, StoreUnavailableError
from celery_scheduler.keys import TaskKey
from celery_scheduler.store.base import (
    Cancel,
    Cursor,
    Put,
    Reschedule,
    Retry,
    RunTimes,
    ScheduleStore,
    State,
    StoredTask,
    bucket_of,
)
from celery_scheduler.store.cassandra import CassandraScheduleStore
from celery_scheduler.store.cassandra_leases import RETIRED_OWNER
from celery_scheduler.store.cql import to_timestamp
from celery_scheduler.store.memory import MemoryScheduleStore
from celery_scheduler.store.records import EntryChange, OperatorAction, Pause, PauseScope, RateLimit

NOW = 1_893_456_000_000  # 2030-01-01T00:00:00Z
B = bucket_of(NOW, 60)


def envelope(ordering_id: str, at: int, unique: str = "u", **changes: object) -> ScheduleEnvelope:
    fields: dict[str, object] = {"args": [ordering_id], **changes}
    return ScheduleEnvelope(key=TaskKey(ordering_id, at, unique), task="proj.remind", **fields)  # type: ignore[arg-type]


@pytest.fixture(params=["memory", pytest.param("cassandra", marks=pytest.mark.cassandra)])
def store(request: pytest.FixtureRequest, unique_name: str) -> Iterator[ScheduleStore]:
    if request.param == "memory":
        yield MemoryScheduleStore(bucket_seconds=60)
        return
    host, port = request.getfixturevalue("cassandra_contact").rsplit(":", 1)
    store = CassandraScheduleStore([host], unique_name, port=int(port), consistency="ONE",
                                   serial_consistency="SERIAL", bucket_seconds=60)
    store.create_schema()
    yield store
    store._session.execute(f"DROP KEYSPACE IF EXISTS {unique_name}")
    store.close()


def test_rows_read_back_in_time_order_through_the_bucket_index(store: ScheduleStore) -> None:
    tasks = [envelope("b", NOW + 30_000), envelope("a", NOW + 10_000), envelope("c", NOW + 70_000),
             envelope("a", NOW + 10_000, "v")]
    stored = [store.put(3, t, NOW) for t in tasks]
    assert [s.bucket for s in stored if s] == [B, B, B + 1, B]

    assert store.buckets(3, 0, B + 100) == [B, B + 1]
    assert store.buckets(4, 0, B + 100) == []
    assert [t.envelope for t in store.read(3, Cursor(B), 100)] == [tasks[1], tasks[3], tasks[0]]
    assert [t.envelope for t in store.read(3, Cursor(B + 1), 100)] == [tasks[2]]
    # cursor positions are exclusive, or inclusive on request
    position = Cursor(B, NOW + 10_000, "a", "u")
    assert [t.envelope for t in store.read(3, position, 100)] == [tasks[3], tasks[0]]
    assert store.read(3, position, 100, inclusive=True)[0].envelope == tasks[1]
    assert len(store.read(3, Cursor(B), 2)) == 2
    status = store.status(tasks[0].key)
    assert status is not None
    assert (status.state, status.partition, status.bucket) == (State.PENDING, 3, B)


def test_overdue_rows_go_to_a_recent_bucket(store: ScheduleStore) -> None:
    old = envelope("a", NOW - 3_600_000)
    stored = store.put(0, old, NOW)
    assert stored is not None and stored.bucket == B - 1
    assert [t.envelope for t in store.read(0, Cursor(B - 1), 10)] == [old]


def test_same_key_overwrites_in_place(store: ScheduleStore) -> None:
    store.put(0, envelope("a", NOW, args=["first"]), NOW)
    store.put(0, envelope("a", NOW, args=["second"]), NOW + 1)
    [row] = store.read(0, Cursor(B), 10)
    assert row.envelope.args == ["second"]


def test_a_pending_key_put_again_later_keeps_its_place_in_the_schedule(store: ScheduleStore) -> None:
    # The record of "a" at +10 s is read again five minutes on (its batch failed half-way,
    # after "a" at +70 s was written): it must stay before +70 s in read order, or a loader
    # stopped between them would hold the later task without the earlier one.
    first, second = envelope("a", NOW + 10_000, "1"), envelope("a", NOW + 70_000, "2")
    store.put(0, first, NOW)
    store.put(0, second, NOW)
    again = store.put(0, envelope("a", NOW + 10_000, "1", args=["again"]), NOW + 300_000)
    assert again is not None and again.bucket == B
    read = [row for bucket in store.buckets(0, 0, B + 100) for row in store.read(0, Cursor(bucket), 100)]
    assert [(row.key, row.envelope.args) for row in read] == [(first.key, ["again"]), (second.key, ["a"])]
    status = store.status(first.key)
    assert status is not None and (status.state, status.bucket) == (State.PENDING, B)


def test_a_key_waiting_for_a_retry_is_not_reset_by_its_record_read_again(store: ScheduleStore) -> None:
    stored = store.put(0, envelope("a", NOW), NOW)
    assert stored is not None
    store.mark_released(stored, 1, NOW + 60_000, NOW)
    store.mark_retry(stored, 1, NOW + 2_000, "boom", NOW + 6)
    assert store.put(0, envelope("a", NOW), NOW + 7) is None
    [row] = store.read(0, Cursor(B), 10)
    assert (row.attempts, row.not_before_ms) == (1, NOW + 2_000)
    status = store.status(stored.key)
    assert status is not None and (status.state, status.attempts) == (State.PENDING, 1)


def run_to_success(store: ScheduleStore, task: ScheduleEnvelope) -> StoredTask:
    """Store *task*, release it once, and finish it as a worker's success would."""
    stored = store.put(0, task, NOW)
    assert stored is not None
    store.mark_released(stored, 1, NOW + 60_000, NOW)
    store.record_outcome(0, stored.key, 1, True, None, NOW + 5)
    store.finish(stored, State.SUCCEEDED, None, NOW + 6)
    return stored


def test_a_finished_status_records_the_run_times(store: ScheduleStore) -> None:
    done = store.put(0, envelope("a", NOW), NOW)
    gave_up = store.put(0, envelope("b", NOW), NOW)
    assert done is not None and gave_up is not None
    store.finish_many([done], State.SUCCEEDED, NOW + 9, {done.key: RunTimes(NOW + 1, NOW + 2, NOW + 3)})
    store.finish(gave_up, State.FAILED, "boom", NOW + 9, run=RunTimes(0, NOW + 4, NOW + 5))
    status = store.status(done.key)
    assert status is not None
    assert (status.released_ms, status.started_ms, status.finished_ms) == (NOW + 1, NOW + 2, NOW + 3)
    status = store.status(gave_up.key)
    assert status is not None  # 0: unknown (released by another dispatcher)
    assert (status.released_ms, status.started_ms, status.finished_ms) == (0, NOW + 4, NOW + 5)


def test_an_outcome_recorded_for_later_keeps_its_run_times(store: ScheduleStore) -> None:
    stored = store.put(0, envelope("a", NOW), NOW)
    assert stored is not None
    store.record_outcomes([(0, stored.key, 1, True, None, NOW + 8_000)], NOW + 5,
                          {stored.key: RunTimes(0, NOW + 2, NOW + 3)})
    status = store.status(stored.key)
    assert status is not None and (status.outcome, status.started_ms, status.finished_ms) == (
        "succeeded", NOW + 2, NOW + 3)
    assert (status.outcome_attempt, status.outcome_generation) == (1, NOW + 8_000)


def test_an_outcome_says_which_release_of_its_attempt_it_came_from(store: ScheduleStore) -> None:
    stored = store.put(0, envelope("a", NOW), NOW)
    assert stored is not None
    store.mark_released(stored, 1, NOW + 8_000, NOW)
    store.record_outcome(0, stored.key, 1, False, "boom", NOW + 5, generation=NOW + 8_000)
    status = store.status(stored.key)
    assert status is not None and (status.outcome, status.outcome_generation) == ("failed", NOW + 8_000)
    store.record_outcome(0, stored.key, 1, False, "boom", NOW + 6)  # a worker that does not say
    status = store.status(stored.key)
    assert status is not None and status.outcome_generation == 0


def test_releases_and_successes_written_together_are_as_written_apart(store: ScheduleStore) -> None:
    going = store.put(0, envelope("a", NOW), NOW)
    done = store.put(1, envelope("b", NOW), NOW)
    retried = store.put(1, envelope("c", NOW), NOW)
    assert going is not None and done is not None and retried is not None
    store.mark_released(done, 1, NOW + 60_000, NOW)
    store.mark_retry(retried, 1, NOW + 5, "boom", NOW + 1)  # its error stays on its status
    retried = replace(retried, attempts=1, not_before_ms=NOW + 5)
    store.mark_released(retried, 2, NOW + 60_000, NOW + 6)
    store.mark_released_and_succeeded(
        [(going, 1, NOW + 70_000)], [done, retried], NOW + 9,
        {done.key: RunTimes(NOW + 1, NOW + 2, NOW + 3)})
    released = store.status(going.key)
    assert released is not None and (released.state, released.attempts) == (State.RELEASED, 1)
    row = store.task(going.key)
    assert row is not None and (row.attempts, row.lease_until_ms) == (1, NOW + 70_000)
    status = store.status(done.key)
    assert status is not None and status.state is State.SUCCEEDED
    assert (status.released_ms, status.started_ms, status.finished_ms) == (NOW + 1, NOW + 2, NOW + 3)
    status = store.status(retried.key)
    assert status is not None and (status.state, status.last_error) == (State.SUCCEEDED, "boom")
    assert store.task(done.key) is None and store.task(retried.key) is None  # rows gone
    store.mark_released_and_succeeded([], [], NOW + 10)  # nothing to write: no request


def test_finished_keys_are_never_stored_again(store: ScheduleStore) -> None:
    stored = run_to_success(store, envelope("a", NOW))
    assert store.read(0, Cursor(B), 10) == []
    assert store.put(0, envelope("a", NOW), NOW + 7) is None
    assert store.read(0, Cursor(B), 10) == []
    status = store.status(stored.key)
    assert status is not None and status.state is State.SUCCEEDED


def test_a_released_key_is_not_overwritten(store: ScheduleStore) -> None:
    stored = store.put(0, envelope("a", NOW), NOW)
    assert stored is not None
    store.mark_released(stored, 1, NOW + 60_000, NOW)
    assert store.put(0, envelope("a", NOW, args=["new"]), NOW + 1) is None
    [row] = store.read(0, Cursor(B), 10)
    assert (row.attempts, row.lease_until_ms, row.envelope.args) == (1, NOW + 60_000, ["a"])


def test_retry_state_is_kept_on_the_row(store: ScheduleStore) -> None:
    stored = store.put(0, envelope("a", NOW), NOW)
    assert stored is not None
    store.mark_released(stored, 1, NOW + 60_000, NOW)
    store.record_outcome(0, stored.key, 1, False, "boom", NOW + 5)
    status = store.status(stored.key)
    assert status is not None and (status.outcome, status.outcome_attempt) == ("failed", 1)
    store.mark_retry(stored, 1, NOW + 2_000, "boom", NOW + 6)
    [row] = store.read(0, Cursor(B), 10)
    assert (row.attempts, row.not_before_ms, row.lease_until_ms) == (1, NOW + 2_000, 0)
    status = store.status(stored.key)
    assert status is not None and (status.state, status.last_error) == (State.PENDING, "boom")


def test_exhausted_task_can_stay_blocked_until_cancelled(store: ScheduleStore) -> None:
    stored = store.put(0, envelope("a", NOW), NOW)
    assert stored is not None
    store.finish(stored, State.FAILED, "gave up", NOW + 1, keep_row=True)
    [row] = store.read(0, Cursor(B), 10)
    assert row.blocked
    assert store.cancel(0, stored.key, NOW + 2) is True
    assert store.read(0, Cursor(B), 10) == []
    status = store.status(stored.key)
    assert status is not None and status.state is State.CANCELLED


def fail_after(store: ScheduleStore, task: ScheduleEnvelope, attempts: int, keep_row: bool
               ) -> StoredTask:
    """Store *task*, release it *attempts* times, and fail it for good."""
    stored = store.put(0, task, NOW)
    assert stored is not None
    for attempt in range(1, attempts + 1):
        store.mark_released(stored, attempt, NOW + 60_000, NOW + attempt)
        stored = StoredTask(stored.partition, stored.bucket, stored.envelope, attempt)
    store.finish(stored, State.FAILED, "gave up", NOW + 10, keep_row=keep_row)
    return stored


def test_a_blocked_task_retried_is_pending_again_unblocked_with_its_attempts(
        store: ScheduleStore) -> None:
    stored = fail_after(store, envelope("a", NOW), 3, keep_row=True)
    retried = store.retry(0, stored.key, NOW + 20)
    assert retried is not None
    assert (retried.bucket, retried.attempts, retried.blocked, retried.lease_until_ms) == (B, 3, False, 0)
    [row] = store.read(0, Cursor(B), 10)
    assert (row.key, row.attempts, row.blocked, row.not_before_ms) == (stored.key, 3, False, 0)
    status = store.status(stored.key)
    assert status is not None
    assert (status.state, status.attempts, status.last_error) == (State.PENDING, 3, "gave up")
    assert store.retry(0, stored.key, NOW + 21) is None  # pending now: nothing to retry


def test_a_failed_task_that_left_the_schedule_comes_back_from_its_kept_envelope(
        store: ScheduleStore) -> None:
    task = envelope("a", NOW - 600_000, args=["kept", {"n": 1}])
    stored = fail_after(store, task, 2, keep_row=False)
    assert store.kept_envelope(stored.key) == task
    assert store.task(stored.key) is None
    later = NOW + 3_600_000
    retried = store.retry(0, stored.key, later)
    assert retried is not None and retried.envelope == task and retried.attempts == 2
    assert retried.bucket == bucket_of(later, 60) - 1  # overdue: a recent bucket
    assert [(r.key, r.attempts) for r in store.read(0, Cursor(retried.bucket), 10)] == [(task.key, 2)]
    status = store.status(task.key)
    assert status is not None and (status.state, status.bucket) == (State.PENDING, retried.bucket)
    # its new attempt fails too: failed again, kept again
    store.mark_released(retried, 3, later + 60_000, later)
    store.finish(StoredTask(0, retried.bucket, task, 3), State.FAILED, "again", later + 5)
    status = store.status(task.key)
    assert status is not None and (status.state, status.attempts) == (State.FAILED, 3)
    assert store.kept_envelope(task.key) == task


def test_only_failed_tasks_are_retried(store: ScheduleStore) -> None:
    pending = store.put(0, envelope("p", NOW), NOW)
    succeeded = run_to_success(store, envelope("s", NOW))
    cancelled = store.put(0, envelope("c", NOW), NOW)
    assert pending is not None and cancelled is not None
    store.cancel(0, cancelled.key, NOW + 1)
    for key in (pending.key, succeeded.key, cancelled.key, TaskKey("never", NOW, "u")):
        assert store.retry(0, key, NOW + 2) is None
    assert [t.key for t in store.read(0, Cursor(B), 10)] == [pending.key]
    assert store.kept_envelope(succeeded.key) is None
    results = store.apply([Retry(0, pending.key), Retry(0, succeeded.key)], NOW + 3)
    assert results == [None, None]


def test_a_retried_key_is_not_reset_by_its_schedule_record_read_again(store: ScheduleStore) -> None:
    stored = fail_after(store, envelope("a", NOW), 2, keep_row=True)
    [retried] = store.apply([Retry(0, stored.key)], NOW + 20)
    assert isinstance(retried, StoredTask)
    assert store.put(0, envelope("a", NOW, args=["other"]), NOW + 21) is None
    [row] = store.read(0, Cursor(B), 10)
    assert (row.attempts, row.envelope.args) == (2, ["a"])


def test_cancel_removes_a_pending_row(store: ScheduleStore) -> None:
    task = envelope("a", NOW)
    store.put(5, task, NOW)
    assert store.cancel(5, task.key, NOW + 1) is True
    assert store.read(5, Cursor(B), 10) == []
    status = store.status(task.key)
    assert status is not None and status.state is State.CANCELLED
    assert store.cancel(5, task.key, NOW + 2) is False
    assert store.cancel(5, TaskKey("never", NOW, "u"), NOW) is False


def test_a_reschedule_moves_a_pending_key_once_and_keeps_where_it_went(store: ScheduleStore) -> None:
    old = envelope("a", NOW + 5_000)
    store.put(0, old, NOW)
    new = envelope("a", NOW + 125_000, args=["moved"])
    other = envelope("b", NOW + 1_000)
    [moved, put] = store.apply([Reschedule(0, old.key, new), Put(0, other)], NOW + 1)
    assert isinstance(moved, StoredTask) and moved.key == new.key and moved.envelope.args == ["moved"]
    assert isinstance(put, StoredTask)
    status = store.status(old.key)
    assert status is not None and status.state is State.RESCHEDULED
    kept = store.kept_envelope(old.key)
    assert kept is not None and kept.key == new.key
    rows = [row.key for b in (B, B + 2) for row in store.read(0, Cursor(b), 10, inclusive=True)]
    assert old.key not in rows and new.key in rows
    # read again (a failed batch): the put is written again, nothing else moves
    assert store.reschedule(0, old.key, new, NOW + 2) is not None
    assert store.reschedule(0, old.key, envelope("a", NOW + 9_000), NOW + 3) is None
    assert store.put(0, old, NOW + 4) is None  # its schedule record read again
    assert store.cancel(0, old.key, NOW + 5) is False


def test_a_reschedule_of_a_released_key_changes_nothing(store: ScheduleStore) -> None:
    stored = store.put(0, envelope("a", NOW), NOW)
    assert stored is not None
    store.mark_released(stored, 1, NOW + 60_000, NOW + 1)
    assert store.reschedule(0, stored.key, envelope("a", NOW + 60_000), NOW + 2) is None
    assert store.status(envelope("a", NOW + 60_000).key) is None
    status = store.status(stored.key)
    assert status is not None and status.state is State.RELEASED


def test_a_release_marked_just_after_a_cancel_leaves_the_key_cancelled(store: ScheduleStore) -> None:
    # A dispatcher took the task, the cancel was applied, then the marking landed and the
    # dispatcher died before publishing: nothing will run it, so it must read as cancelled.
    stored = store.put(0, envelope("a", NOW), NOW)
    later = store.put(0, envelope("a", NOW + 1_000, "v"), NOW)
    assert stored is not None and later is not None
    assert store.cancel(0, stored.key, NOW + 1) is True
    store.mark_released(stored, 1, NOW + 60_000, NOW + 2)
    assert [row.key for row in store.read(0, Cursor(B), 10)] == [later.key]
    status = store.status(stored.key)
    assert status is not None and status.state is State.CANCELLED
    assert store.put(0, envelope("a", NOW), NOW + 3) is None  # and it stays so


def test_a_stale_release_after_completion_leaves_the_key_succeeded(store: ScheduleStore) -> None:
    stored = run_to_success(store, envelope("a", NOW))
    store.mark_released(stored, 2, NOW + 60_000, NOW + 7)  # a previous owner, late
    assert store.read(0, Cursor(B), 10) == []
    status = store.status(stored.key)
    assert status is not None and status.state is State.SUCCEEDED


def test_rows_without_a_task_do_not_shorten_a_page(store: ScheduleStore) -> None:
    # The loader takes a page shorter than it asked for as the end of the bucket.
    rows = [store.put(0, envelope(f"o{i}", NOW + i * 1_000), NOW) for i in range(5)]
    assert all(row is not None for row in rows)
    for row in rows[1:3]:
        assert row is not None and store.cancel(0, row.key, NOW + 1) is True
        store.mark_released(row, 1, NOW + 60_000, NOW + 2)
    assert [row.key.ordering_id for row in store.read(0, Cursor(B), 3)] == ["o0", "o3", "o4"]
    assert [store.status(row.key).state for row in rows if row is not None] == [  # type: ignore[union-attr]
        State.PENDING, State.CANCELLED, State.CANCELLED, State.PENDING, State.PENDING]


def test_drop_bucket_removes_it_from_the_index(store: ScheduleStore) -> None:
    store.put(1, envelope("a", NOW), NOW)
    store.drop_bucket(1, B)
    assert store.buckets(1, 0, B + 10) == []


def test_partition_leases_fence_owners(store: ScheduleStore) -> None:
    first = store.acquire_lease(7, "one", 10_000, NOW)
    assert first is not None and first.epoch == 1
    assert store.acquire_lease(7, "two", 10_000, NOW + 1) is None  # held
    renewed = store.renew_lease(first, 10_000, NOW + 5_000)
    assert renewed is not None and renewed.expires_ms == NOW + 15_000
    # once expired, another owner takes it with a higher epoch, and the old one cannot renew
    second = store.acquire_lease(7, "two", 10_000, NOW + 16_000)
    assert second is not None and second.epoch == 2
    assert store.renew_lease(renewed, 10_000, NOW + 16_001) is None
    # a released lease is free at once
    store.release_lease(second)
    third = store.acquire_lease(7, "three", 10_000, NOW + 16_002)
    assert third is not None and third.epoch == 3


def test_a_dispatchers_leases_are_taken_and_renewed_together(store: ScheduleStore) -> None:
    taken = store.acquire_leases([1, 2, 3], "one", 10_000, NOW)
    assert sorted(taken) == [1, 2, 3] and {lease.owner for lease in taken.values()} == {"one"}
    # partition 2 is held: another dispatcher takes only the free one of those it asks for
    assert list(store.acquire_leases([2, 4], "two", 10_000, NOW + 1)) == [4]
    # once expired, partition 2 changes hands; the renewal of the others still goes through
    assert store.acquire_lease(2, "two", 10_000, NOW + 11_000) is not None
    renewed = store.renew_leases([taken[1], taken[2], taken[3]], 10_000, NOW + 11_001)
    assert [lease.expires_ms if lease else None for lease in renewed] == [
        NOW + 21_001, None, NOW + 21_001]
    assert {lease.partition: (lease.owner, lease.epoch) for lease in store.leases()} == {
        1: ("one", 1), 2: ("two", 2), 3: ("one", 1), 4: ("two", 1)}


@pytest.mark.cassandra
def test_a_keyspace_of_an_earlier_version_gets_the_leases_table_and_its_old_leases_retired(
        cassandra_contact: str, unique_name: str) -> None:
    host, port = cassandra_contact.rsplit(":", 1)
    store = CassandraScheduleStore([host], unique_name, port=int(port), consistency="ONE",
                                   serial_consistency="SERIAL")
    try:
        store.create_schema()
        # a keyspace that `scheduler init` of an earlier version made has no leases table
        store._session.execute(f"DROP TABLE {unique_name}.leases")
        with pytest.raises(SchemaMissingError, match=r"'leases'.*scheduler init"):
            store.check_schema()  # what a dispatcher does at start
        store.create_schema()  # `scheduler init` of this version
        store.check_schema()
        store._session.execute(f"DROP TABLE {unique_name}.pauses")  # nor a pauses table
        with pytest.raises(SchemaMissingError, match=r"'pauses'.*operators' pauses.*scheduler init"):
            store.check_schema()
        store.create_schema()
        store.check_schema()
        old_leases = f"{unique_name}.partition_lease"
        store._session.execute(f"INSERT INTO {old_leases} (partition, owner, epoch, expires_at)"
                               " VALUES (5, 'old', 3, %s)", (to_timestamp(NOW + 10_000),))
        assert store.acquire_lease(5, "new", 10_000, NOW) is None  # the earlier version holds it
        assert store.acquire_lease(6, "new", 10_000, NOW) is not None  # never leased there
        assert store.acquire_lease(5, "new", 10_000, NOW + 10_001) is not None  # let go
        rows = {row.partition: row for row in store._session.execute(
            f"SELECT partition, owner, epoch, expires_at FROM {old_leases}")}
        # an earlier version takes a row only once it has expired: these never do
        assert {(row.owner, row.epoch) for row in rows.values()} == {(RETIRED_OWNER, 4),
                                                                       (RETIRED_OWNER, 1)}
        assert all(row.expires_at.year == 9999 for row in rows.values())
        assert [lease.partition for lease in store.leases()] == [5, 6]
    finally:
        store._session.execute(f"DROP KEYSPACE IF EXISTS {unique_name}")
        store.close()


@pytest.mark.cassandra
def test_missing_schema_is_a_clear_error(cassandra_contact: str) -> None:
    host, port = cassandra_contact.rsplit(":", 1)
    store = CassandraScheduleStore([host], "no_such_keyspace", port=int(port), consistency="ONE")
    try:
        with pytest.raises(SchemaMissingError, match="scheduler init"):
            store.status(TaskKey("a", NOW, "u"))
    finally:
        store.close()


@pytest.mark.cassandra
def test_init_moves_the_statuses_of_a_keyspace_made_by_an_earlier_version(
        cassandra_contact: str, unique_name: str) -> None:
    host, port = cassandra_contact.rsplit(":", 1)
    store = CassandraScheduleStore([host], unique_name, port=int(port), consistency="ONE")
    session = store._session
    try:
        # the first version's keyspace: statuses one partition a key, without the later columns
        session.execute(f"CREATE KEYSPACE {unique_name} WITH replication ="
                        " {'class': 'SimpleStrategy', 'replication_factor': 1}")
        session.execute(f"CREATE TABLE {unique_name}.task_status (ordering_id text, at timestamp,"
                        " unique_key text, state text, task text, partition int, bucket bigint,"
                        " attempts int, last_error text, outcome text, outcome_attempt int,"
                        " updated_at timestamp, PRIMARY KEY ((ordering_id, at, unique_key)))")
        insert = (f"INSERT INTO {unique_name}.task_status (ordering_id, at, unique_key, state, task,"
                  " partition, bucket, attempts, last_error, updated_at) VALUES"
                  " (%s, %s, %s, %s, 'proj.remind', 3, %s, %s, %s, %s)")
        pending, done = TaskKey("a", NOW + 5_000, "u"), TaskKey("b", NOW - 1_000_000, "v")
        session.execute(insert, (pending.ordering_id, pending.scheduled_at, pending.uniqueness_key,
                                 "pending", B, 0, None, pending.scheduled_at))
        session.execute(insert + " USING TTL 5000",
                        (done.ordering_id, done.scheduled_at, done.uniqueness_key, "succeeded", B - 5,
                         2, "first attempt failed", pending.scheduled_at))
        with pytest.raises(SchemaMissingError, match=r"'task_status'.*scheduler init"):
            store.check_schema()  # what a dispatcher does at start

        store.create_schema()  # what `scheduler init` runs

        store.check_schema()
        moved = store.statuses([pending, done])
        assert [(s.state, s.partition, s.bucket, s.attempts, s.last_error) if s else None
                for s in moved] == [(State.PENDING, 3, B, 0, None),
                                    (State.SUCCEEDED, 3, B - 5, 2, "first attempt failed")]
        ttl = ("SELECT TTL(updated_at) AS ttl FROM {ks}.key_status WHERE shard = ? AND slot = ?"
               " AND at = ? AND ordering_id = ? AND unique_key = ?")
        kept = store._cql.execute("read", ttl, store.layout.primary_key(pending)).one().ttl
        expiring = store._cql.execute("read", ttl, store.layout.primary_key(done)).one().ttl
        assert kept is None and 0 < expiring <= 5000
        store._cluster.refresh_schema_metadata()
        assert "task_status" not in store._cluster.metadata.keyspaces[unique_name].tables
        store.create_schema()  # again: nothing left to move
        assert store.status(done) == moved[1]
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {unique_name}")
        store.close()


def test_unreachable_cassandra_is_a_typed_error() -> None:
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError, match="connect"):
        CassandraScheduleStore(["127.0.0.1"], "ks", port=1, request_timeout=2.0)
    assert time.monotonic() - started < 15


def test_apply_writes_a_set_of_operations_like_single_calls(store: ScheduleStore) -> None:
    keep, drop, done = envelope("a", NOW), envelope("b", NOW + 1), envelope("c", NOW + 2)
    store.put(0, drop, NOW)
    finished = store.put(0, done, NOW)
    assert finished is not None
    store.finish(finished, State.SUCCEEDED, None, NOW)

    never = Cancel(0, TaskKey("x", NOW, "u"))
    results = store.apply([Put(0, keep), Cancel(0, drop.key), Put(0, done), never], NOW + 5)

    assert isinstance(results[0], StoredTask) and results[0].envelope == keep
    assert results[1:] == [True, None, False]
    assert [t.envelope for t in store.read(0, Cursor(B), 10)] == [keep]
    with pytest.raises(ValueError, match="one operation per task key"):
        store.apply([Put(0, keep), Cancel(0, keep.key)], NOW)


def test_statuses_reads_many_keys_in_order(store: ScheduleStore) -> None:
    first, second = envelope("a", NOW), envelope("b", NOW + 1)
    stored = store.put(0, first, NOW)
    store.put(0, second, NOW)
    assert stored is not None
    store.mark_released(stored, 1, NOW + 60_000, NOW)
    unknown = TaskKey("never", NOW, "u")

    statuses = store.statuses([second.key, unknown, first.key])

    assert [s.key if s else None for s in statuses] == [second.key, None, first.key]
    assert [s.state if s else None for s in statuses] == [State.PENDING, None, State.RELEASED]
    assert store.statuses([]) == []


def test_statuses_of_many_keys_across_shards_and_slots(store: ScheduleStore) -> None:
    # 150 keys of one ordering id in one ten-minute slot (more than one request asks for),
    # and keys of ten ordering ids spread over about 40 minutes
    crowd = [envelope("same", NOW + i, f"u{i}") for i in range(150)]
    spread = [envelope(f"o{i % 10}", NOW + i * 20_000, f"s{i}") for i in range(120)]
    results = store.apply([Put(i % 12, e) for i, e in enumerate(crowd + spread)], NOW)
    assert all(isinstance(r, StoredTask) for r in results)
    finished = results[3]
    assert isinstance(finished, StoredTask)
    store.finish(finished, State.SUCCEEDED, None, NOW + 1)
    unknown = [TaskKey("same", NOW + 500, "u-none"), TaskKey("o1", NOW + 20_000, "none"),
               TaskKey("nobody", NOW - 10**9, "x")]
    asked = [e.key for e in spread[::-1]] + unknown + [e.key for e in crowd] + [crowd[0].key]

    statuses = store.statuses(asked)

    assert [s.key if s else None for s in statuses] == [*asked[:120], None, None, None, *asked[123:]]
    states = [s.state for s in statuses if s is not None]
    assert states.count(State.SUCCEEDED) == 1 and states.count(State.PENDING) == len(asked) - 4


def test_operator_queries_count_backlog_per_bucket_and_list_an_ordering_id(
        store: ScheduleStore) -> None:
    tasks = [envelope("a", NOW + 10_000), envelope("b", NOW + 20_000),
             envelope("a", NOW + 70_000, "v"), envelope("c", NOW + 200_000)]
    for task in tasks:
        assert store.put(5, task, NOW) is not None
    assert store.bucket_sizes(5, B, B + 1) == {B: 2, B + 1: 1}  # the range is inclusive
    assert store.bucket_sizes(5, B + 2, B + 10) == {B + 3: 1}
    assert store.bucket_sizes(6, 0, B + 10) == {}
    assert store.backlog(5) == (4, NOW + 10_000)
    assert [row.envelope for row in store.rows_of(5, "a")] == [tasks[0], tasks[2]]
    stored = store.task(tasks[1].key)
    assert stored is not None
    store.finish(stored, State.FAILED, "boom", NOW + 30_000)
    [failed] = store.statuses_in_state(State.FAILED, 10)
    assert (failed.key, failed.last_error) == (tasks[1].key, "boom")
    assert len(store.statuses_in_state(State.PENDING, 10)) == 3
    assert len(store.statuses_in_state(State.PENDING, 2)) == 2


def test_what_periodic_entries_fired_is_kept_by_partition_and_the_latest_wins(
        store: ScheduleStore) -> None:
    assert store.last_fired(2) == {}
    store.note_fired(2, {"nightly": NOW, "hourly": NOW + 3_600_000})
    store.note_fired(3, {"nightly": NOW - 86_400_000})
    store.note_fired(2, {})  # nothing fired: nothing written
    assert store.last_fired(2) == {"nightly": NOW, "hourly": NOW + 3_600_000}
    store.note_fired(2, {"hourly": NOW + 7_200_000})
    assert store.last_fired(2) == {"nightly": NOW, "hourly": NOW + 7_200_000}
    assert store.last_fired(3) == {"nightly": NOW - 86_400_000}
    assert store.last_fired(4) == {}


def test_periodic_entries_changed_at_run_time_are_kept_whole_and_forgotten(
        store: ScheduleStore) -> None:
    assert store.entry_changes() == {}
    paused = EntryChange("nightly", paused=True, updated_ms=NOW)
    added = EntryChange("sweep", definition='{"task": "proj.sweep", "schedule": 60.0}',
                        resumed_ms=NOW - 1000, updated_ms=NOW)
    store.change_entry(paused)
    store.change_entry(added)
    assert store.entry_changes() == {"nightly": paused, "sweep": added}
    resumed = EntryChange("nightly", resumed_ms=NOW + 5, updated_ms=NOW + 5)
    store.change_entry(resumed)  # replaces the one before, whole
    store.forget_entry_change("sweep")
    store.forget_entry_change("never-changed")
    assert store.entry_changes() == {"nightly": resumed}


@pytest.mark.cassandra
def test_batches_stay_under_cassandras_batch_size_warning(
        cassandra_contact: str, unique_name: str, caplog: pytest.LogCaptureFixture) -> None:
    # Ingest, release and completion of 400 tasks of 100 ordering ids at once: each call's
    # writes are packed into requests; none may be a batch Cassandra warns of (over 5 KiB
    # across several partitions), which it would log, and the driver with it, every time.
    host, port = cassandra_contact.rsplit(":", 1)
    store = CassandraScheduleStore([host], unique_name, port=int(port), consistency="ONE",
                                   serial_consistency="SERIAL", bucket_seconds=60)
    try:
        store.create_schema()
        tasks = [envelope(f"order-{i % 100}", NOW + i * 50, f"u{i}", kwargs={"note": "x" * 200})
                 for i in range(400)]
        with caplog.at_level("WARNING", logger="cassandra"):
            stored = [r for r in store.apply([Put(i % 12, e) for i, e in enumerate(tasks)], NOW)
                      if isinstance(r, StoredTask)]
            store.mark_released_many([(t, 1, NOW + 60_000) for t in stored], NOW)
            store.finish_many(stored, State.SUCCEEDED, NOW + 1)
        assert len(stored) == 400
        assert [s.state for s in store.statuses([t.key for t in tasks])] == [State.SUCCEEDED] * 400
        warned = [r.getMessage() for r in caplog.records if "Batch for" in r.getMessage()]
        assert warned == []
    finally:
        store._session.execute(f"DROP KEYSPACE IF EXISTS {unique_name}")
        store.close()


def test_pauses_are_kept_replaced_by_scope_and_value_and_dropped(store: ScheduleStore) -> None:
    assert store.pauses() == []
    mail = Pause(PauseScope.TASK, "proj.mail", NOW, "ops@host", "smtp down")
    customer = Pause(PauseScope.ORDERING_ID, "customer/42", NOW + 1)
    everything = Pause(PauseScope.ALL, "", NOW + 2, "console")
    for pause in (mail, customer, everything):
        store.put_pause(pause)
    again = replace(mail, reason="still down")
    store.put_pause(again)
    assert sorted(store.pauses(), key=lambda p: p.paused_ms) == [again, customer, everything]
    store.drop_pause(PauseScope.ORDERING_ID, "customer/42")
    store.drop_pause(PauseScope.ORDERING_ID, "never-paused")  # harmless
    assert sorted(store.pauses(), key=lambda p: p.paused_ms) == [again, everything]


def test_a_named_task_keeps_the_key_it_was_last_scheduled_under(store: ScheduleStore) -> None:
    assert store.named_keys([("a", "u")]) == {}
    store.name_keys([(3, TaskKey("a", NOW, "u")), (4, TaskKey("b", NOW, "v"))], NOW - 1_000)
    store.name_keys([(3, TaskKey("a", NOW + 60_000, "u"))], NOW)
    assert store.named_keys([("a", "u"), ("b", "v"), ("c", "w")]) == {
        ("a", "u"): TaskKey("a", NOW + 60_000, "u"), ("b", "v"): TaskKey("b", NOW, "v")}


def test_rate_limits_are_kept_replaced_by_scope_and_value_and_dropped(store: ScheduleStore) -> None:
    assert store.rate_limits() == []
    mail = RateLimit(PauseScope.TASK, "proj.mail", 50.0, NOW, "ops@host")
    customer = RateLimit(PauseScope.ORDERING_ID, "customer/42", 0.5, NOW + 1)
    for limit in (mail, customer):
        store.put_rate_limit(limit)
    faster = replace(mail, per_second=120.0, set_ms=NOW + 2)
    store.put_rate_limit(faster)
    assert sorted(store.rate_limits(), key=lambda r: r.set_ms) == [customer, faster]
    store.drop_rate_limit(PauseScope.ORDERING_ID, "customer/42")
    store.drop_rate_limit(PauseScope.TASK, "never-limited")  # harmless
    assert store.rate_limits() == [faster]


def test_the_operators_log_reads_newest_first_across_months(store: ScheduleStore) -> None:
    assert store.actions(10, NOW) == []
    last_month = OperatorAction(NOW - 3 * 24 * 3600 * 1000, "ops@host", "pause", "everything", "why")
    lines = [last_month] + [OperatorAction(NOW + n, "console", "cancel", f"key-{n}") for n in range(3)]
    for line in lines:
        store.note_action(line)
    assert store.actions(10, NOW + 10) == lines[::-1]
    assert store.actions(2, NOW + 10) == lines[:1:-1]
