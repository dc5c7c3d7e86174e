"""The ingest loop and the engine never decide one task key at once (dispatcher/claims.py)."""

from __future__ import annotations

import threading

import pytest

from celery_scheduler.dispatcher.claims import Claims
from celery_scheduler.envelope import ScheduleEnvelope
from celery_scheduler.errors import StoreUnavailableError
from celery_scheduler.keys import TaskKey
from celery_scheduler.store.base import Cancel, Put

A, B = TaskKey("a", 1, "u"), TaskKey("b", 1, "u")


def test_keys_held_by_the_ingest_loop_are_not_taken_for_release() -> None:
    claims = Claims()
    with claims.ingesting([Put(0, ScheduleEnvelope(A, "proj.remind"))]):
        assert claims.take_for_release([A, B]) == {B}
    claims.marked({B})
    assert claims.take_for_release([A]) == {A}


def test_a_cancel_holds_its_task_back_until_the_engine_notes_it() -> None:
    claims = Claims()
    with claims.ingesting([Cancel(3, A)]):
        pass
    assert claims.take_for_release([A]) == set()
    claims.cancel_noted(A)
    assert claims.take_for_release([A]) == {A}


def test_a_cancel_whose_write_failed_still_holds_its_task_back() -> None:
    claims = Claims()
    with pytest.raises(RuntimeError), claims.ingesting([Cancel(3, A)]):
        raise RuntimeError("the write timed out: it may have landed")
    assert claims.take_for_release([A]) == set()
    claims.forget_partitions([2])
    assert claims.unsettled_cancels() == 1
    claims.forget_partitions([3])  # given up: the next owner reads the store
    assert claims.take_for_release([A]) == {A}


def test_the_ingest_loop_waits_for_a_marking_to_end() -> None:
    claims = Claims()
    assert claims.take_for_release([A]) == {A}
    entered = threading.Event()

    def cancel() -> None:
        with claims.ingesting([Cancel(0, A)]):
            entered.set()

    thread = threading.Thread(target=cancel)
    thread.start()
    assert not entered.wait(0.2)
    claims.marked({A})
    assert entered.wait(5)
    thread.join(5)


def test_a_marking_that_never_ends_gives_the_round_up_with_a_typed_error() -> None:
    claims = Claims(wait_seconds=0.05)
    claims.take_for_release([A])
    with pytest.raises(StoreUnavailableError, match=r"marked released for over 0\.05s"), \
            claims.ingesting([Put(0, ScheduleEnvelope(A, "proj.remind"))]):
        pass
    assert claims.take_for_release([B]) == {B}  # nothing was held by the failed round
