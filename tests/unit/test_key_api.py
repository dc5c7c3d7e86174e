"""Reaching a task by its key from any process: key_at, status and cancel, and key parts
given as ints and UUIDs."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from celery_scheduler import State, TaskKey
from celery_scheduler.errors import InvalidKeyError
from celery_scheduler.keys import key_text
from celery_scheduler.tasklog.base import Position
from celery_scheduler.testing import SchedulerTesting
from tests.unit.apps import calls, remind
from tests.unit.conftest import START

# the conftest's scheduler fixture: the unit app in memory, its clock starting at START

def test_key_at_is_the_key_the_schedule_call_gets(scheduler: SchedulerTesting) -> None:
    due = START + dt.timedelta(hours=1, microseconds=1500)  # rounds up to the millisecond
    handle = remind.schedule_at(due, "c1", kind="welcome")
    assert remind.key_at(due, "c1", kind="welcome") == handle.key
    assert remind.key_at(due, customer_id="c1", kind="welcome") == handle.key
    assert handle.key.scheduled_ms == int(START.timestamp() * 1000) + 3_600_002
    assert remind.key_at(due, "c1", kind="other") != handle.key
    # a naive time is read in app.timezone (UTC here), as schedule_at reads it
    naive = due.replace(tzinfo=None)
    assert remind.key_at(naive, "c1", kind="welcome") == handle.key
    assert remind.schedule_at(naive, "c1", kind="welcome").key == handle.key


def test_status_and_cancel_by_key_from_the_parts_alone(scheduler: SchedulerTesting) -> None:
    calls.clear()
    handle = remind.schedule_in(3600, "c1", kind="welcome")
    stored = TaskKey(handle.key.ordering_id, handle.key.scheduled_ms, handle.key.uniqueness_key)
    scheduler.advance(1)
    status = remind.status(stored)
    assert status is not None and status.state is State.PENDING and status.key == handle.key
    position = remind.cancel(stored)
    assert isinstance(position, Position) and position.offset >= 0
    assert scheduler.advance(dt.timedelta(hours=2)) == []
    status = remind.status(stored)
    assert status is not None and status.state is State.CANCELLED
    assert calls == []


def test_handle_cancel_returns_where_kafka_took_it(scheduler: SchedulerTesting) -> None:
    handle = remind.schedule_in(60, "c2")
    position = handle.cancel()
    assert isinstance(position, Position)
    assert position.partition == handle.wait().partition  # same ordering id, same partition
    assert position.offset > handle.wait().offset
    assert scheduler.advance(120) == []


def test_status_is_none_until_a_dispatcher_stored_the_key(scheduler: SchedulerTesting) -> None:
    never = TaskKey("nobody", int(START.timestamp() * 1000), "nothing")
    assert remind.status(never) is None


@pytest.mark.parametrize("bad", [("c1", 1, "k"), "c1@2030-01-01#k", None])
def test_a_key_that_is_not_a_task_key_is_refused_with_how_to_make_one(
        scheduler: SchedulerTesting, bad: object) -> None:
    with pytest.raises(InvalidKeyError, match=r"expected a TaskKey, got .*TaskKey\(ordering_id"):
        remind.status(bad)
    with pytest.raises(InvalidKeyError, match="expected a TaskKey"):
        remind.cancel(bad)


def test_int_and_uuid_key_parts_are_their_text(scheduler: SchedulerTesting) -> None:
    customer = uuid.UUID("12345678-1234-5678-1234-567812345678")
    by_int = remind.schedule_in(10, 42, kind=customer)
    assert by_int.key.ordering_id == "42"
    assert by_int.key.uniqueness_key == "12345678-1234-5678-1234-567812345678"
    # the same key as the text: scheduled twice, it runs once
    remind.schedule_at(by_int.key.scheduled_at, "42", kind=str(customer))
    runs = scheduler.advance(20)
    assert [r.key for r in runs] == [by_int.key]
    assert remind.key_at(by_int.key.scheduled_at, 42, kind=customer) == by_int.key


def test_key_text_rules() -> None:
    import enum

    class Size(enum.IntEnum):
        LARGE = 3

    assert key_text("x", "ordering id") == "x"
    assert key_text(-7, "ordering id") == "-7"
    assert key_text(Size.LARGE, "ordering id") == "3"  # the number, not "Size.LARGE"
    assert key_text(uuid.UUID(int=1), "uniqueness key") == "00000000-0000-0000-0000-000000000001"
    for bad in (True, 4.2, b"x", None):
        with pytest.raises(InvalidKeyError, match="must be a string"):
            key_text(bad, "ordering id")
