"""A batch's records are written in rounds that keep each ordering id's Kafka order."""

from __future__ import annotations

from celery_scheduler.dispatcher.rounds import Rounds, operation_of
from celery_scheduler.envelope import (
    CancelEnvelope,
    RescheduleEnvelope,
    RetryEnvelope,
    ScheduleEnvelope,
)
from celery_scheduler.keys import TaskKey
from celery_scheduler.store.records import Cancel, Put, Reschedule, Retry


def _put(ordering_id: str, at: int) -> Put:
    return Put(0, ScheduleEnvelope(TaskKey(ordering_id, at, "u"), "proj.remind", []))


def _cancel(ordering_id: str, at: int) -> Cancel:
    return Cancel(0, TaskKey(ordering_id, at, "u"))


def test_each_ordering_id_has_one_operation_a_round_in_the_order_read() -> None:
    rounds = Rounds()
    ops = [_put("a", 1), _put("b", 1), _put("a", 2), _put("a", 3), _put("b", 2)]
    for op in ops:
        rounds.add(op)
    assert rounds.rounds == [[ops[0], ops[1]], [ops[2], ops[4]], [ops[3]]]


def test_cancels_of_other_keys_in_a_row_share_a_round_but_not_with_their_schedule() -> None:
    rounds = Rounds()
    ops = [_put("a", 1), _cancel("a", 2), _cancel("a", 3), _cancel("a", 3), _put("a", 4)]
    for op in ops:
        rounds.add(op)
    # a cancel of the same key again, and a put after cancels, each wait for a round
    assert rounds.rounds == [[ops[0]], [ops[1], ops[2]], [ops[3]], [ops[4]]]


def test_a_cancel_after_a_schedule_of_its_key_comes_after_it() -> None:
    rounds = Rounds()
    ops = [_put("a", 1), _cancel("a", 1)]
    for op in ops:
        rounds.add(op)
    assert rounds.rounds == [[ops[0]], [ops[1]]]


def test_each_envelope_is_the_operation_of_its_kind() -> None:
    key = TaskKey("a", 5, "u")
    schedule = ScheduleEnvelope(key, "proj.remind", [])
    moved = ScheduleEnvelope(TaskKey("a", 9, "u"), "proj.remind", [])
    assert operation_of(schedule, 3, b"x") == Put(3, schedule, b"x")
    assert operation_of(CancelEnvelope(key, 1), 3) == Cancel(3, key)
    assert operation_of(RetryEnvelope(key, 1), 3) == Retry(3, key)
    assert operation_of(RescheduleEnvelope(key, moved, 1), 3) == Reschedule(3, key, moved)
