"""Delayed Kafka messages: the call's checks, the envelope, and the rules of a scheduled
task (order per ordering id, dedupe, cancel) through the testing helper's real engine."""

from __future__ import annotations

import datetime as dt

import pytest

from celery_scheduler import schedule_message
from celery_scheduler.decoding import decode
from celery_scheduler.envelope import encode
from celery_scheduler.errors import EnvelopeDecodeError, ScheduleError, ScheduleTimeError
from celery_scheduler.messages import MESSAGE_TASK, DelayedMessage
from celery_scheduler.store.base import State
from celery_scheduler.testing import SchedulerTesting
from tests.unit.apps import app
from tests.unit.conftest import START

UTC = dt.timezone.utc


def test_a_message_is_produced_when_due_in_order_once(scheduler: SchedulerTesting) -> None:
    later = schedule_message("invoices", b"second", key=b"c-1", countdown=120, ordering_id="c-1",
                             app=app)
    first = schedule_message("invoices", "first", headers={"kind": "due"}, countdown=60,
                             ordering_id="c-1", app=app)
    schedule_message("invoices", "first", headers={"kind": "due"}, countdown=60,
                     ordering_id="c-1", app=app)  # the same message again: dropped
    scheduler.advance(59)
    assert scheduler.messages == []
    scheduler.advance(61)
    assert [(at - START).total_seconds() for at, _ in scheduler.messages] == [60, 120]
    assert [m for _, m in scheduler.messages] == [
        DelayedMessage("invoices", b"first", None, (("kind", b"due"),)),
        DelayedMessage("invoices", b"second", b"c-1")]
    for handle in (first, later):
        status = handle.status()
        assert status is not None and status.state is State.SUCCEEDED
    assert first.envelope.task == MESSAGE_TASK


def test_a_cancelled_message_is_never_produced(scheduler: SchedulerTesting) -> None:
    handle = schedule_message("invoices", b"x", countdown=60, ordering_id="c-2", app=app)
    scheduler.advance(1)
    handle.cancel()
    scheduler.advance(120)
    assert scheduler.messages == []
    status = handle.status()
    assert status is not None and status.state is State.CANCELLED


@pytest.mark.parametrize(("call", "error", "match"), [
    ({"topic": "no spaces"}, ScheduleError, "not a Kafka topic name"),
    ({"topic": "t" * 250}, ScheduleError, "not a Kafka topic name"),
    ({"value": 42}, ScheduleError, "value must be bytes or text"),
    ({"key": 1.5}, ScheduleError, "key must be bytes or text"),
    ({"headers": [("a",)]}, ScheduleError, "headers must be"),
    ({"headers": {"a": object()}}, ScheduleError, "header 'a' must be bytes or text"),
    ({"countdown": None}, ScheduleTimeError, "exactly one of at= .* and countdown="),
    ({"countdown": -3600}, ScheduleTimeError, "beyond the grace window"),
    ({"ordering_id": ""}, ScheduleError, "ordering id"),
])
def test_a_bad_message_call_is_refused_with_the_reason(scheduler: SchedulerTesting, call: dict,
                                                       error: type[Exception], match: str) -> None:
    arguments = {"topic": "invoices", "value": b"v", "countdown": 60, "ordering_id": "c-3", **call}
    with pytest.raises(error, match=match):
        schedule_message(arguments.pop("topic"), arguments.pop("value"), app=app, **arguments)
    assert scheduler.records() == []


def test_a_message_envelope_carries_any_bytes_and_refuses_a_malformed_one() -> None:
    message = DelayedMessage.make("t", bytes(range(256)), "k\u00e9", [("h", b"\x00\xff")])
    assert message == DelayedMessage("t", bytes(range(256)), "k\u00e9".encode(), (("h", b"\x00\xff"),))
    from celery_scheduler.envelope import ScheduleEnvelope
    from celery_scheduler.keys import TaskKey

    envelope = ScheduleEnvelope(TaskKey("o", 1, "u"), MESSAGE_TASK, args=message.args())
    decoded = decode(encode(envelope))
    assert isinstance(decoded, ScheduleEnvelope) and DelayedMessage.of(decoded) == message
    for args in ([], ["t", "not base64!", None, []], ["bad topic", "", None, []], ["t", "", None, [["h"]]]):
        with pytest.raises(EnvelopeDecodeError):
            DelayedMessage.of(ScheduleEnvelope(TaskKey("o", 1, "u"), MESSAGE_TASK, args=args))


def test_a_dispatcher_refuses_a_malformed_message_record(scheduler: SchedulerTesting) -> None:
    from celery_scheduler.client import get_client
    from celery_scheduler.envelope import ScheduleEnvelope
    from celery_scheduler.errors import SchedulerError
    from celery_scheduler.keys import TaskKey

    when = int((START + dt.timedelta(minutes=1)).timestamp() * 1000)
    get_client(app).publish(ScheduleEnvelope(TaskKey("o", when, "u"), MESSAGE_TASK,
                                             args=["bad topic", "", None, []]))
    with pytest.raises(SchedulerError, match="not a valid delayed Kafka message"):
        scheduler.advance(120)
