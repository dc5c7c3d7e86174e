"""The lifecycle table (store/lifecycle.py), driven directly: every transition of a task key,
what it writes, and the CQL both stores' writes come from."""

from __future__ import annotations

from dataclasses import replace

import hypothesis
import pytest
from hypothesis import strategies as st

from celery_scheduler.envelope import ScheduleEnvelope
from celery_scheduler.keys import TaskKey
from celery_scheduler.store import cql, lifecycle
from celery_scheduler.store.base import RunTimes, State, StoredTask, TaskStatus, bucket_of
from celery_scheduler.store.lifecycle import TRANSITIONS, Event, Expiry, RowKind
from celery_scheduler.store.memory import MemoryScheduleStore
from celery_scheduler.store.status_layout import StatusLayout
from tests.unit.budget import examples

NOW = 1_893_456_000_000  # 2030-01-01T00:00:00Z
KEY = TaskKey("o", NOW + 90_000, "u")
ENVELOPE = ScheduleEnvelope(KEY, "proj.remind", ["o"])
TASK = StoredTask(2, bucket_of(KEY.scheduled_ms, 60), ENVELOPE)


def status(state: State, **fields: object) -> TaskStatus:
    return replace(TaskStatus(KEY, state, "proj.remind", 2, bucket=TASK.bucket), **fields)  # type: ignore[arg-type]


def test_final_states_are_left_by_nothing_but_their_own_confirmation() -> None:
    for (state, event), after in TRANSITIONS.items():
        if state in lifecycle.FINAL:
            assert after is state, (state, event)
    assert set(TRANSITIONS.values()) == set(State)  # every state is reached by some event


def test_a_key_never_seen_may_only_be_scheduled() -> None:
    assert [event for state, event in TRANSITIONS if state is None] == [Event.SCHEDULE]
    assert lifecycle.next_state(None, Event.CANCEL) is None
    assert lifecycle.cancelled(None, NOW) is None
    assert lifecycle.retried(2, None, None, ENVELOPE, NOW, 60) is None


def test_a_schedule_record_writes_a_pending_row_and_status_for_good() -> None:
    transition = lifecycle.scheduled(2, ENVELOPE, None, NOW, 60, data=b"as read")
    assert transition is not None and transition.state is State.PENDING
    assert transition.row is not None and transition.row.kind is RowKind.INSERT
    row = transition.row
    assert (row.partition, row.bucket, row.data) == (2, TASK.bucket, b"as read")
    assert dict(transition.status)["attempts"] == 0 and transition.expiry is Expiry.NEVER


@pytest.mark.parametrize("current", [
    status(State.RELEASED, attempts=1), status(State.SUCCEEDED), status(State.FAILED),
    status(State.CANCELLED), status(State.PENDING, attempts=1)])
def test_a_schedule_record_read_again_never_undoes_a_later_step(current: TaskStatus) -> None:
    assert lifecycle.scheduled(2, ENVELOPE, current, NOW, 60) is None


def test_a_pending_key_is_rewritten_where_it_is_or_moved_from_another_partition() -> None:
    pending = status(State.PENDING, bucket=TASK.bucket - 5)
    here = lifecycle.scheduled(2, ENVELOPE, pending, NOW, 60)
    assert here is not None and here.row is not None
    assert (here.row.bucket, here.row.moved_from) == (TASK.bucket - 5, None)
    moved = lifecycle.scheduled(7, ENVELOPE, pending, NOW, 60)
    assert moved is not None and moved.row is not None
    assert (moved.row.partition, moved.row.moved_from) == (7, (2, TASK.bucket - 5))


def test_a_cancel_removes_a_pending_or_blocked_key_and_nothing_else() -> None:
    for current in (status(State.PENDING), status(State.FAILED)):
        transition = lifecycle.cancelled(current, NOW)
        assert transition is not None and transition.state is State.CANCELLED
        assert transition.row is not None and transition.row.kind is RowKind.DELETE
        assert transition.expiry is Expiry.FINAL
    assert lifecycle.cancelled(status(State.FAILED), NOW, row_kept=False) is None  # failed and gone
    for state in (State.RELEASED, State.SUCCEEDED, State.CANCELLED):
        assert lifecycle.cancelled(status(state), NOW) is None


def test_a_retry_unblocks_the_row_kept_or_brings_the_kept_task_back_with_its_attempts() -> None:
    failed = status(State.FAILED, attempts=3, last_error="boom")
    blocked_row = replace(TASK, attempts=3, blocked=True)
    unblocked = lifecycle.retried(2, failed, blocked_row, None, NOW, 60)
    assert unblocked is not None and unblocked.row is not None
    assert unblocked.row.kind is RowKind.UPDATE and dict(unblocked.row.fields)["blocked"] is False
    back = lifecycle.retried(2, failed, None, ENVELOPE, NOW, 60)
    assert back is not None and back.row is not None and back.row.task is not None
    assert back.row.kind is RowKind.INSERT and back.row.task.attempts == 3
    assert dict(back.status)["envelope"] is None and back.expiry is Expiry.NEVER
    assert lifecycle.retried(2, failed, None, None, NOW, 60) is None  # nothing kept to run
    assert lifecycle.retried(2, status(State.PENDING), None, ENVELOPE, NOW, 60) is None


def test_a_failed_task_keeps_its_task_for_a_retry_and_a_blocked_one_its_row() -> None:
    gave_up = lifecycle.finished(TASK, State.FAILED, "boom", None, NOW)
    assert dict(gave_up.status)["envelope"] == ENVELOPE and gave_up.expiry is Expiry.FINAL
    assert gave_up.row is not None and gave_up.row.kind is RowKind.DELETE
    held = lifecycle.blocked(TASK, "boom", None, NOW)
    assert held.state is State.FAILED and held.expiry is Expiry.NEVER  # kept while it blocks
    assert held.row is not None and dict(held.row.fields)["blocked"] is True
    succeeded = lifecycle.finished(TASK, State.SUCCEEDED, None, status(State.RELEASED, last_error="x"), NOW)
    assert "envelope" not in dict(succeeded.status) and dict(succeeded.status)["last_error"] == "x"
    with pytest.raises(ValueError, match="not cancelled"):
        lifecycle.finished(TASK, State.CANCELLED, None, None, NOW)


def test_a_row_left_by_a_late_write_settles_its_key_as_the_report_says() -> None:
    released = status(State.RELEASED, outcome="succeeded")
    assert lifecycle.settled(released, 2, TASK.bucket, KEY, None, NOW).state is State.SUCCEEDED
    assert lifecycle.settled(status(State.PENDING), 2, TASK.bucket, KEY, None, NOW).state is State.CANCELLED
    unreadable = lifecycle.settled(status(State.PENDING), 2, TASK.bucket, KEY, "bad bytes", NOW)
    assert unreadable.state is State.FAILED and dict(unreadable.status)["last_error"] == "bad bytes"
    elsewhere = lifecycle.settled(status(State.PENDING), 3, TASK.bucket, KEY, None, NOW)
    assert elsewhere.state is None and elsewhere.status == {}  # only the remnant goes


def test_every_function_leads_where_the_table_says() -> None:
    cases = [
        (None, lifecycle.scheduled(2, ENVELOPE, None, NOW, 60)),
        (State.PENDING, lifecycle.cancelled(status(State.PENDING), NOW)),
        (State.FAILED, lifecycle.retried(2, status(State.FAILED), None, ENVELOPE, NOW, 60)),
        (State.PENDING, lifecycle.released(TASK, 1, NOW + 8000, NOW)),
        (State.RELEASED, lifecycle.retry_later(TASK, 1, NOW + 1000, "boom", NOW)),
        (State.RELEASED, lifecycle.finished(TASK, State.SUCCEEDED, None, None, NOW)),
        (State.RELEASED, lifecycle.finished(TASK, State.FAILED, "boom", None, NOW)),
        (State.RELEASED, lifecycle.blocked(TASK, "boom", None, NOW)),
        (State.RELEASED, lifecycle.reported(KEY, 1, True, None, NOW)),
        (State.RELEASED, lifecycle.reported(KEY, 1, False, "boom", NOW)),
        (State.RELEASED, lifecycle.settled(status(State.RELEASED), 2, TASK.bucket, KEY, None, NOW)),
    ]
    for before, transition in cases:
        assert transition is not None
        assert lifecycle.next_state(before, transition.event) is transition.state, transition.event
        written = dict(transition.status).get("state")
        assert written in (None, transition.state), transition.event  # a report of a failure writes none


# --- one key's whole life, on the memory store, against the table -----------------------------

EVENTS = st.sampled_from(["schedule", "cancel", "retry", "release", "retry later", "succeed",
                          "give up", "block", "report success", "report failure"])


@hypothesis.settings(max_examples=examples(500), deadline=None, database=None)
@hypothesis.given(st.lists(EVENTS, max_size=12))
def test_any_sequence_of_events_leaves_the_store_where_the_table_says(events: list[str]) -> None:
    store = MemoryScheduleStore(bucket_seconds=60)
    state: State | None = None
    attempt = 0
    for name in events:
        current, row = store.status(KEY), store.task(KEY)
        now = NOW + attempt
        if name == "schedule":
            stored = store.put(2, ENVELOPE, now)
            expected = lifecycle.next_state(state, Event.SCHEDULE)
            if state is State.PENDING and current is not None and current.attempts > 0:
                expected = None  # it waits for a retry: never rewritten
            assert (stored is not None) == (expected is not None), (state, name)
        elif name == "cancel":
            assert store.cancel(2, KEY, now) == (lifecycle.next_state(state, Event.CANCEL) is not None
                                                 and (state is not State.FAILED or row is not None))
        elif name == "retry":
            retried = store.retry(2, KEY, now)
            assert (retried is not None) <= (lifecycle.next_state(state, Event.RETRY) is not None)
        elif row is not None:  # the dispatcher's events need the row it holds
            event = {"release": Event.RELEASE, "retry later": Event.RETRY_LATER, "succeed": Event.SUCCEED,
                     "give up": Event.GIVE_UP, "block": Event.BLOCK, "report success": Event.REPORT_SUCCESS,
                     "report failure": Event.REPORT_FAILURE}[name]
            if lifecycle.next_state(state, event) is None or row.blocked:
                continue  # a dispatcher never sends it in this state
            attempt += 1
            if event is Event.RELEASE:
                store.mark_released(row, attempt, now + 8000, now)
            elif event is Event.RETRY_LATER:
                store.mark_retry(row, attempt, now + 1000, "boom", now)
            elif event in (Event.SUCCEED, Event.GIVE_UP):
                store.finish(row, State.SUCCEEDED if event is Event.SUCCEED else State.FAILED, None, now,
                             run=RunTimes(now, now, now))
            elif event is Event.BLOCK:
                store.finish(row, State.FAILED, "boom", now, keep_row=True)
            else:
                store.record_outcome(2, KEY, attempt, event is Event.REPORT_SUCCESS, "boom", now)
            assert getattr(store.status(KEY), "state", None) is lifecycle.next_state(state, event), name
        after = store.status(KEY)
        state = after.state if after is not None else None
        if state is State.CANCELLED:
            assert store.task(KEY) is None, "a cancelled key left its row"


# --- the CQL of a transition --------------------------------------------------------------------

LAYOUT = StatusLayout(12)


@pytest.mark.parametrize("transition", [
    lifecycle.scheduled(2, ENVELOPE, None, NOW, 60),
    lifecycle.scheduled(7, ENVELOPE, status(State.PENDING), NOW, 60),
    lifecycle.cancelled(status(State.PENDING), NOW),
    lifecycle.retried(2, status(State.FAILED), replace(TASK, blocked=True), None, NOW, 60),
    lifecycle.retried(2, status(State.FAILED), None, ENVELOPE, NOW, 60),
    lifecycle.released(TASK, 1, NOW + 8000, NOW),
    lifecycle.retry_later(TASK, 1, NOW + 1000, "boom", NOW),
    lifecycle.finished(TASK, State.SUCCEEDED, None, None, NOW, RunTimes(NOW, NOW + 1, NOW + 2)),
    lifecycle.finished(TASK, State.FAILED, "boom", None, NOW),
    lifecycle.blocked(TASK, "boom", None, NOW),
    lifecycle.reported(KEY, 1, True, None, NOW),
    lifecycle.reported(KEY, 1, False, "boom", NOW),
    lifecycle.settled(status(State.RELEASED), 2, TASK.bucket, KEY, None, NOW),
], ids=lambda t: t.event.value if t else "none")
def test_each_statement_binds_one_value_a_placeholder(transition: lifecycle.Transition | None) -> None:
    assert transition is not None
    statements = cql.transition_statements(LAYOUT, transition, ttl=3600)
    assert statements
    for text, params in statements:
        assert text.count("?") == len(params), text


def test_a_release_writes_what_the_dispatcher_always_sent() -> None:
    [row, written] = cql.transition_statements(LAYOUT, lifecycle.released(TASK, 2, NOW + 8000, NOW), 3600)
    assert row == ("UPDATE {ks}.schedule SET attempts = ?, lease_until = ? WHERE partition = ? AND bucket = ?"
                   " AND at = ? AND ordering_id = ? AND unique_key = ?",
                   (2, NOW + 8000, 2, TASK.bucket, KEY.scheduled_ms, "o", "u"))
    assert written == ("UPDATE {ks}.key_status SET state = ?, attempts = ?, updated_at = ?"
                       f" WHERE {cql.STATUS_KEY}", ("released", 2, NOW, *LAYOUT.primary_key(KEY)))


def test_a_final_status_is_written_whole_with_its_ttl_and_a_kept_one_for_good() -> None:
    succeeded = lifecycle.finished(TASK, State.SUCCEEDED, None, None, NOW)
    [_, final] = cql.transition_statements(LAYOUT, succeeded, 3600)
    assert final[0] == cql.FINAL_STATUS and final[1][-1] == 3600
    [_, kept] = cql.transition_statements(LAYOUT, lifecycle.blocked(TASK, "boom", None, NOW), 3600)
    assert kept[0] == cql.FINAL_STATUS and kept[1][-1] == 0
    [report] = cql.transition_statements(LAYOUT, lifecycle.reported(KEY, 1, True, None, NOW), 3600)
    assert report[0].startswith("UPDATE {ks}.key_status USING TTL ?") and report[1][0] == 3600
