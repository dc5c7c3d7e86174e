from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest

from celery_scheduler import RetryPolicy, TaskKey, as_scheduled, constant, scheduled_task
from celery_scheduler.errors import (
    EnvelopeTooLargeError,
    InvalidKeyError,
    NotAScheduledTaskError,
    NotSerializableError,
    ScheduleError,
    ScheduleTimeError,
)
from celery_scheduler.partitioner import partition_for
from celery_scheduler.testing import SchedulerRecorder, scheduler_testing
from tests.unit.apps import app, calls, charge, note, plain, remind, rollup

UTC = dt.timezone.utc


@pytest.fixture
def recorder() -> Iterator[SchedulerRecorder]:
    calls.clear()
    with scheduler_testing(app) as recorder:
        yield recorder


def in_an_hour() -> dt.datetime:
    return dt.datetime.now(UTC).replace(microsecond=0) + dt.timedelta(hours=1)


def test_schedule_at_records_the_call_with_its_key(recorder: SchedulerRecorder) -> None:
    when = in_an_hour()
    handle = remind.schedule_at(when, "customer-42", kind="welcome")

    assert handle.key == TaskKey("customer-42", int(when.timestamp() * 1000), "welcome")
    [envelope] = recorder.pending()
    assert envelope.task == "unit.remind"
    assert envelope.args == ["customer-42"]
    assert envelope.kwargs == {"kind": "welcome"}
    # keyed by ordering id into the partition Kafka's Java client would choose
    assert handle.wait().partition == partition_for("customer-42", 12)


def test_task_still_works_as_a_plain_celery_task() -> None:
    calls.clear()
    assert remind("c", kind="k") == "c:k"
    assert remind.apply(("c",), {"kind": "direct"}).get() == "c:direct"
    assert calls == [("c", "k"), ("c", "direct")]
    assert remind.name == "unit.remind" and callable(remind.delay)


def test_ordering_id_from_callable_and_constant(recorder: SchedulerRecorder) -> None:
    charge.schedule_in(60, 7, amount=100)
    rollup.schedule_in(dt.timedelta(minutes=5))
    ordering_ids = {e.task: e.key.ordering_id for e in recorder.pending()}
    assert ordering_ids == {"unit.charge": "account-7", "unit.rollup": "global"}


def test_default_uniqueness_key_is_a_digest_of_the_call(recorder: SchedulerRecorder) -> None:
    when = in_an_hour()
    first = charge.schedule_at(when, 7, 100)
    again = charge.schedule_at(when, 7, amount=100)
    other = charge.schedule_at(when, 7, 200)
    assert first.key == again.key != other.key
    assert first.key.uniqueness_key.startswith("call-")


def test_scheduling_the_same_key_again_overwrites(recorder: SchedulerRecorder) -> None:
    when = in_an_hour()
    remind.schedule_at(when, "c1", kind="k")
    remind.schedule(("c1",), {"kind": "k"}, at=when, queue="urgent")
    [envelope] = recorder.pending()
    assert envelope.options == {"queue": "urgent"}


def test_per_call_overrides_and_celery_options(recorder: SchedulerRecorder) -> None:
    handle = remind.schedule(("c1",), countdown=30, ordering_id="tenant-9", uniqueness_key="u1",
                             queue="mail", priority=5, time_limit=60,
                             retry=RetryPolicy(max_attempts=2))
    [envelope] = recorder.pending()
    assert handle.key.ordering_id == "tenant-9" and handle.key.uniqueness_key == "u1"
    assert envelope.options == {"queue": "mail", "priority": 5, "time_limit": 60}
    assert envelope.retry.max_attempts == 2


def test_cancel_removes_the_pending_task(recorder: SchedulerRecorder) -> None:
    handle = remind.schedule_in(60, "c1")
    keep = remind.schedule_in(60, "c2")
    handle.cancel()
    assert recorder.cancelled() == [handle.key]
    assert [e.key for e in recorder.pending()] == [keep.key]


def test_non_blocking_calls_resolve_after_flush(recorder: SchedulerRecorder) -> None:
    handles = [remind.schedule(("c",), {"kind": str(i)}, countdown=10, wait=False) for i in range(20)]
    assert as_scheduled(remind).client.flush(5) == 0
    assert all(h.done() for h in handles)
    assert len(recorder.pending()) == 20


def test_result_is_the_async_result_of_the_task_id(recorder: SchedulerRecorder) -> None:
    when = in_an_hour()
    handle = remind.schedule_at(when, "customer-42", kind="welcome")
    result = handle.result()
    assert result.id == handle.task_id and result.app is app
    assert result.state == "PENDING"  # not released yet
    # a worker stores the outcome under the id derived from the key: any process finds it
    app.backend.store_result(TaskKey("customer-42", int(when.timestamp() * 1000), "welcome").task_id,
                             "customer-42:welcome", "SUCCESS")
    assert handle.result().get(timeout=1) == "customer-42:welcome"


def test_run_due_runs_tasks_eagerly_in_time_order(recorder: SchedulerRecorder) -> None:
    now = dt.datetime.now(UTC)
    remind.schedule_at(now + dt.timedelta(seconds=2), "c", kind="second")
    remind.schedule_at(now + dt.timedelta(seconds=1), "c", kind="first")
    results = recorder.run_due()
    assert [r.get() for r in results] == ["c:first", "c:second"]
    assert recorder.pending() == []


def test_naive_datetime_follows_the_app_timezone(recorder: SchedulerRecorder) -> None:
    naive = dt.datetime.now(UTC).replace(microsecond=0, tzinfo=None) + dt.timedelta(hours=2)
    handle = remind.schedule_at(naive, "c")
    assert handle.key.scheduled_at == naive.replace(tzinfo=UTC)  # app.timezone is UTC


# --- bad input: each a typed error naming the value --------------------------------------


def test_time_in_the_past_beyond_grace(recorder: SchedulerRecorder) -> None:
    with pytest.raises(ScheduleTimeError, match="in the past, beyond the grace window of 5"):
        remind.schedule_at(dt.datetime.now(UTC) - dt.timedelta(minutes=1), "c")
    # within the grace window it is accepted and runs as soon as possible
    remind.schedule_at(dt.datetime.now(UTC) - dt.timedelta(seconds=1), "c")


@pytest.mark.parametrize("when", ["2030-01-01", 1893456000, None])
def test_time_must_be_a_datetime(recorder: SchedulerRecorder, when: object) -> None:
    with pytest.raises(ScheduleTimeError):
        remind.schedule_at(when, "c")  # type: ignore[arg-type]


@pytest.mark.parametrize("delay", ["10", float("nan"), True])
def test_delay_must_be_a_number(recorder: SchedulerRecorder, delay: object) -> None:
    with pytest.raises(ScheduleTimeError, match="delay"):
        remind.schedule_in(delay, "c")  # type: ignore[arg-type]


def test_non_json_argument(recorder: SchedulerRecorder) -> None:
    with pytest.raises(NotSerializableError, match=r"kwargs\['kind'\] = <object"):
        remind.schedule_in(10, "c", kind=object())


def test_envelope_over_the_size_limit(recorder: SchedulerRecorder) -> None:
    with pytest.raises(EnvelopeTooLargeError, match="over the limit of 4096"):
        note.schedule_in(10, "c", text="x" * 5000)
    assert recorder.pending() == []


@pytest.mark.parametrize(("ordering_id", "message"), [
    ("", "must not be empty"),
    (4.2, "must be a string .*, got float 4.2"),
    (True, "must be a string .*, got bool True"),
    ("x" * 600, "over the limit"),
    ("bad\ud800", "not valid Unicode"),
])
def test_invalid_ordering_id(recorder: SchedulerRecorder, ordering_id: object, message: str) -> None:
    with pytest.raises(InvalidKeyError, match=message):
        remind.schedule_in(10, ordering_id)


def test_unicode_ordering_id_is_fine(recorder: SchedulerRecorder) -> None:
    handle = remind.schedule_in(10, "клиент-😀")
    assert handle.wait().partition == partition_for("клиент-😀", 12)


def test_missing_ordering_id(recorder: SchedulerRecorder) -> None:
    def no_ordering_run() -> None:
        pass

    no_ordering = scheduled_task(app.task(name="unit.no_ordering")(no_ordering_run))
    with pytest.raises(InvalidKeyError, match="without an ordering id"):
        no_ordering.schedule_in(10)
    no_ordering.schedule(countdown=10, ordering_id="given")
    assert recorder.pending()[0].key.ordering_id == "given"


def test_ordering_id_must_name_a_parameter() -> None:
    def typo(customer_id: str) -> None:
        pass

    with pytest.raises(InvalidKeyError, match=r"'customer' of task unit.typo is not one of its parameters"):
        scheduled_task(ordering_id="customer")(app.task(name="unit.typo")(typo))


def test_arguments_must_match_the_task(recorder: SchedulerRecorder) -> None:
    with pytest.raises(ScheduleError, match=r"do not match task unit\.remind"):
        remind.schedule_in(10, "c", nope=1)


def test_unknown_celery_option(recorder: SchedulerRecorder) -> None:
    with pytest.raises(ScheduleError, match="unknown Celery option 'serializer'"):
        remind.schedule(("c",), countdown=10, serializer="pickle")
    with pytest.raises(ScheduleError, match="priority='high'"):
        remind.schedule(("c",), countdown=10, priority="high")


def test_undecorated_task() -> None:
    with pytest.raises(NotAScheduledTaskError, match="not a scheduled task"):
        as_scheduled(plain)
    with pytest.raises(NotAScheduledTaskError, match="decorates a Celery task"):
        scheduled_task(ordering_id=constant("x"))(lambda: None)
    assert as_scheduled(remind.task) is remind


def test_signed_calls_carry_a_verifiable_signature() -> None:
    from celery_scheduler.signing import HEADER, Signer

    secret = "unit-test-secret-0123456789"
    app.conf.scheduler_signing_keys = {"k1": secret}
    app.conf.scheduler_signing_key_id = "k1"
    vars(app).pop("_celery_scheduler_settings", None)
    try:
        with scheduler_testing(app) as recorder:
            handle = remind.schedule_in(60, "c1")
            partition = handle.wait().partition
            [(key, value)] = recorder.task_log.records(partition)
            [headers] = recorder.task_log.headers[partition]
            assert Signer({"k1": secret}, "k1").problem(key.encode(), value, headers[HEADER]) is None
            later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)
            remind.schedule_many([(later, ("c1",)), (later, ("c1",), {"kind": "k"})])
            signed = list(zip(recorder.task_log.records(partition),
                              recorder.task_log.headers[partition], strict=True))
            assert len(signed) == 3 and all(
                Signer({"k1": secret}, "k1").problem(key.encode(), value, headers[HEADER]) is None
                for (key, value), headers in signed)
    finally:
        app.conf.update(scheduler_signing_keys={}, scheduler_signing_key_id=None)
        vars(app).pop("_celery_scheduler_settings", None)


def test_a_dispatcher_releases_only_its_own_apps_scheduled_tasks() -> None:
    from celery import Celery

    from celery_scheduler.api import registered

    other = Celery("other-app", set_as_current=False)

    @scheduled_task(ordering_id="who")
    @other.task(name="other_app.greet", shared=False)  # only the other app has it
    def greet(who: str) -> str:
        return who

    assert "other_app.greet" in registered() and remind.name in registered()
    assert "other_app.greet" not in registered(app) and remind.name in registered(app)
    assert "other_app.greet" in registered(other)  # (and the shared tasks, as Celery shares them)


def test_a_shared_task_schedules_through_the_current_apps_client() -> None:
    from celery import Celery, shared_task

    @scheduled_task(ordering_id="who")
    @shared_task(name="unit.shared_hello")
    def hello(who: str) -> str:
        return who

    first, second = Celery("first"), Celery("second")
    when = in_an_hour()
    with scheduler_testing(first) as one, scheduler_testing(second) as two:
        first.set_current()
        hello.schedule_at(when, "a")
        second.set_current()
        hello.schedule_at(when, "b")
        first.set_current()
        hello.schedule_at(when, "c")
    assert [e.key.ordering_id for e in one.pending()] == ["a", "c"]
    assert [e.key.ordering_id for e in two.pending()] == ["b"]
    app.set_current()
