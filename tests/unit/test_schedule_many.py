"""``schedule_many``: many calls checked like ``schedule``'s, encoded once, acknowledged as one."""

from __future__ import annotations

import datetime as dt
import decimal
import inspect
import math
import types
import uuid
from typing import Any

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from celery_scheduler import Call, RetryPolicy, TaskKey, scheduled_task
from celery_scheduler.arguments import (
    MAX_CHAR_BYTES,
    Binder,
    _utf8,
    plain_kwargs_size,
    plain_size,
)
from celery_scheduler.envelope import ScheduleEncoder, ScheduleEnvelope, encode
from celery_scheduler.errors import (
    EnvelopeTooLargeError,
    InvalidKeyError,
    NotSerializableError,
    ScheduleError,
    ScheduleTimeError,
    TaskLogUnavailableError,
)
from celery_scheduler.tasklog.base import Ack
from celery_scheduler.tasklog.memory import MemoryTaskLog
from celery_scheduler.testing import SchedulerTesting
from tests.unit.apps import app, charge, note, remind
from tests.unit.conftest import START

UTC = dt.timezone.utc


def _document(envelope: ScheduleEnvelope) -> dict[str, Any]:
    return envelope.as_json()


@pytest.mark.parametrize(("args", "kwargs", "options", "retry"), [
    (["c1"], {"kind": "welcome"}, {}, RetryPolicy()),
    (["ünïcode ✓", 1.5, None, True], {"z": [1, {"b": 2, "a": 1}], "a": "x"}, {"queue": "mail"},
     RetryPolicy(3, 2.0, 30.0)),
    ([2**70], {}, {}, RetryPolicy()),  # beyond orjson's integers: the standard library's
    ([{"__type__": "datetime", "__value__": "2030-01-01T00:00:00"}], {},
     {"headers": {"b": 1, "a": 2}, "priority": 5}, RetryPolicy(1, 0.0, 0.0)),
    ([], {}, {"expires": 2**70}, RetryPolicy()),  # shared fields the fast encoder refuses
])
def test_the_encoder_writes_the_bytes_encode_writes(args: list[Any], kwargs: dict[str, Any],
                                                    options: dict[str, Any],
                                                    retry: RetryPolicy) -> None:
    key = TaskKey("o-1", 1_893_456_000_123, "u\"nique\\")
    envelope = ScheduleEnvelope.checked(key, "proj.task", args, kwargs, options, retry, 42)
    encoder = ScheduleEncoder("proj.task", options, retry, 10_000)
    assert encoder.encode(key.ordering_id, key.scheduled_ms, key.uniqueness_key, args, kwargs,
                          42) == encode(envelope, 10_000)


@pytest.mark.parametrize(("args", "options"), [
    (["c1", 7, -1.5, None, True, "ünïcode \"✓\""], {}),
    ([], {"queue": "mail", "headers": {"b": 1, "a": 2}}),
])
def test_the_plain_encoder_writes_the_bytes_encode_writes(args: list[Any],
                                                          options: dict[str, Any]) -> None:
    key = TaskKey("o-1", 1_893_456_000_123, "u\"nique\\")
    envelope = ScheduleEnvelope.checked(key, "proj.task", args, {}, options, RetryPolicy(), 42)
    encoder = ScheduleEncoder("proj.task", options, RetryPolicy(), 10_000)
    assert encoder.encode(key.ordering_id, key.scheduled_ms, key.uniqueness_key,
                          tuple(args), {}, 42, plain=True) == encode(envelope, 10_000)


@pytest.mark.parametrize(("args", "options"), [([2**70], {}), ([1], {"expires": 2**70})])
def test_the_plain_encoder_leaves_what_orjson_cannot_write_to_encode(
        args: list[Any], options: dict[str, Any]) -> None:
    key = TaskKey("o", 1, "u")
    envelope = ScheduleEnvelope.checked(key, "proj.task", args, {}, options, RetryPolicy(), 0)
    assert ScheduleEncoder("proj.task", options, RetryPolicy()).encode(
        "o", 1, "u", args, {}, 0, plain=True) == encode(envelope)


def test_the_encoder_refuses_an_envelope_over_the_limit() -> None:
    encoder = ScheduleEncoder("proj.task", {}, RetryPolicy(), 200)
    with pytest.raises(EnvelopeTooLargeError, match=r"encodes to .* over the limit of 200"):
        encoder.encode("o", 1, "u", ["x" * 300], {}, 0)
    with pytest.raises(EnvelopeTooLargeError, match=r"encodes to .* over the limit of 200"):
        encoder.encode("o", 1, "u", ["x" * 300], {}, 0, plain=True)


def test_schedule_many_publishes_what_schedule_would(scheduler: SchedulerTesting) -> None:
    times = [START + dt.timedelta(minutes=minutes) for minutes in (5, 5, 90)]
    for when, customer in zip(times, ("c1", "c2", "c1"), strict=True):
        remind.schedule_at(when, customer, kind=f"k-{customer}-{when.minute}")
    one_by_one = [_document(envelope) for envelope in scheduler.records()]
    scheduler.task_log._records = [[] for _ in range(scheduler.task_log.partitions())]

    batch = remind.schedule_many(
        (when, (customer,), {"kind": f"k-{customer}-{when.minute}"})
        for when, customer in zip(times, ("c1", "c2", "c1"), strict=True))

    assert [_document(envelope) for envelope in scheduler.records()] == one_by_one
    assert batch.count == 3 and batch.done() and batch.failed() == []
    assert batch.keys == [TaskKey("c1", _ms(times[0]), "k-c1-5"), TaskKey("c2", _ms(times[1]), "k-c2-5"),
                          TaskKey("c1", _ms(times[2]), "k-c1-30")]
    batch.wait(0)  # acknowledged already: returns


def _ms(when: dt.datetime) -> int:
    return int(when.timestamp() * 1000)


def test_calls_come_in_every_documented_shape(scheduler: SchedulerTesting) -> None:
    when = START + dt.timedelta(hours=1)
    batch = remind.schedule_many(iter([
        Call(when, ("c1",)),                                  # kwargs left out: the default
        Call(when, ["c2"], types.MappingProxyType({"kind": "k2"})),
        (when, ("c3",)),
        [when, ("c4",), {"kind": "k4"}],
        (when.replace(tzinfo=None), (), {"customer_id": "c5"}),  # naive: app.timezone (UTC)
    ]))
    assert [key.ordering_id for key in batch.keys] == ["c1", "c2", "c3", "c4", "c5"]
    assert [key.uniqueness_key for key in batch.keys] == ["default", "k2", "default", "k4",
                                                          "default"]
    assert {key.scheduled_ms for key in batch.keys} == {_ms(when)}
    assert len(scheduler.pending()) == 5


def test_values_json_does_not_carry_as_they_are_are_encoded_as_schedule_does(
        scheduler: SchedulerTesting) -> None:
    when = START + dt.timedelta(hours=1)
    values = ["c1", dt.datetime(2030, 1, 1, tzinfo=UTC), uuid.UUID(int=7), decimal.Decimal("1.5"),
              b"\x00", (1, 2), 2**70]
    note.schedule_at(when, "c1", text=values)  # type: ignore[arg-type]
    [one_by_one] = scheduler.records()
    scheduler.task_log._records = [[] for _ in range(scheduler.task_log.partitions())]
    note.schedule_many([(when, ("c1",), {"text": values})])
    [batched] = scheduler.records()
    assert _document(batched) == _document(one_by_one)
    assert batched.kwargs["text"][1] == {"__type__": "datetime",
                                         "__value__": "2030-01-01T00:00:00+00:00"}


@scheduled_task(ordering_id="customer_id", uniqueness_key="step")
@app.task(name="unit.tally")
def tally(customer_id: str, step: str, amount: int) -> None:
    pass


def test_an_integer_beyond_64_bits_is_encoded_as_schedule_does(
        scheduler: SchedulerTesting) -> None:
    when = START + dt.timedelta(hours=1)
    tally.schedule_at(when, "c1", "s1", 2**70)
    tally.schedule_at(when, "c1", "s2", 5)
    one_by_one = [_document(envelope) for envelope in scheduler.records()]
    scheduler.task_log._records = [[] for _ in range(scheduler.task_log.partitions())]
    tally.schedule_many([(when, ("c1", "s1", 2**70)), (when, ("c1", "s2", 5))])
    assert [_document(envelope) for envelope in scheduler.records()] == one_by_one
    assert one_by_one[0]["args"] == ["c1", "s1", 2**70]


def test_the_default_uniqueness_key_is_the_call_digest(scheduler: SchedulerTesting) -> None:
    when = START + dt.timedelta(hours=1)
    handle = note.schedule_at(when, "c1", "hello")
    batch = note.schedule_many([(when, ("c1",), {"text": "hello"})])
    assert batch.keys == [handle.key]  # f(a, b) and f(a, text=b) are one call


def test_options_and_retry_apply_to_every_call(scheduler: SchedulerTesting) -> None:
    when = START + dt.timedelta(hours=1)
    policy = RetryPolicy(2, 3.0, 9.0)
    charge.schedule_many([(when, (1, 10)), (when, (2, 20))], retry=policy, queue="money",
                         priority=3)
    envelopes = scheduler.pending()
    assert [(e.key.ordering_id, e.args) for e in envelopes] == [("account-1", [1, 10]),
                                                                  ("account-2", [2, 20])]
    assert all(e.options == {"queue": "money", "priority": 3} and e.retry == policy
               for e in envelopes)


@pytest.mark.parametrize(("bad", "error", "says"), [
    ((START + dt.timedelta(hours=1), ("c9", "k", "extra")), ScheduleError, "arguments do not match"),
    ((START + dt.timedelta(hours=1), (4.2,)), InvalidKeyError, "ordering id must be a string"),
    ((START + dt.timedelta(hours=1), ("c9",), {"kind": ""}), InvalidKeyError, "must not be empty"),
    ((START + dt.timedelta(hours=1), ("c9",), {"kind": math.nan}), NotSerializableError,
     "cannot be encoded"),
    ((START - dt.timedelta(hours=1), ("c9",)), ScheduleTimeError, "in the past"),
    ((None, ("c9",)), ScheduleTimeError, "has no time"),
    (("tomorrow", ("c9",)), ScheduleTimeError, "must be a datetime"),
    ((START + dt.timedelta(hours=1),), ScheduleError, r"must be \(at, args\)"),
    ("c9", ScheduleError, r"must be \(at, args\)"),
    ((START + dt.timedelta(hours=1), "c9"), ScheduleError, "must be a list or tuple"),
    ((START + dt.timedelta(hours=1), ("c9",), {1: "x"}), ScheduleError, "string keys"),
])
def test_a_bad_call_raises_its_own_error_with_its_index_and_nothing_is_published(
        scheduler: SchedulerTesting, bad: Any, error: type[Exception], says: str) -> None:
    good = (START + dt.timedelta(hours=1), ("c1",), {"kind": "k"})
    with pytest.raises(error, match=says) as raised:
        remind.schedule_many([good, good, bad, good])
    assert type(raised.value) is error
    assert str(raised.value).startswith("call 2 of the batch (")
    assert scheduler.records() == []


def test_an_argument_json_cannot_carry_is_refused_with_its_index(
        scheduler: SchedulerTesting) -> None:
    when = START + dt.timedelta(hours=1)
    with pytest.raises(NotSerializableError, match=r"call 1 of the batch .*cannot be encoded"):
        note.schedule_many([(when, ("c1", "ok")), (when, ("c1", math.inf))])
    with pytest.raises(NotSerializableError, match="call 0 of the batch"):
        note.schedule_many([(when, ("c1", object()))])
    with pytest.raises(NotSerializableError, match=r"call 1 of the batch .*cannot be encoded"):
        note.schedule_many([(when, ("c1", "ok")), (when, ("c1", "lone \ud800"))])
    assert scheduler.records() == []


def test_what_is_not_a_list_of_calls_is_refused(scheduler: SchedulerTesting) -> None:
    for calls in ("abc", {"at": START}, 5):
        with pytest.raises(ScheduleError, match="calls must be an iterable"):
            remind.schedule_many(calls)  # type: ignore[arg-type]
    with pytest.raises(ScheduleError, match="retry must be a RetryPolicy"):
        remind.schedule_many([], retry=3)  # type: ignore[arg-type]
    with pytest.raises(ScheduleError, match="unknown Celery option 'colour'"):
        remind.schedule_many([], colour="red")
    assert remind.schedule_many([]).count == 0


class FailingLog(MemoryTaskLog):
    """Takes every record; fails those whose key is in *failing*."""

    def __init__(self, failing: set[str]) -> None:
        super().__init__(12)
        self.failing = failing

    def publish_async(self, key: str, value: bytes, headers: dict[str, bytes] | None = None
                      ) -> Ack:
        if key not in self.failing:
            return super().publish_async(key, value, headers)
        ack = Ack()
        ack.settle(None, TaskLogUnavailableError(f"no ack for {key}"))
        return ack


def test_calls_kafka_does_not_acknowledge_are_named(scheduler: SchedulerTesting,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    client = remind.client
    monkeypatch.setattr(client, "_task_log", FailingLog({"c2", "c4"}))
    when = START + dt.timedelta(hours=1)
    calls = [(when, (f"c{i}",), {"kind": "k"}) for i in range(6)]
    with pytest.raises(TaskLogUnavailableError, match=r"2 of 6 record\(s\) .*no ack for c2"):
        remind.schedule_many(calls)
    batch = remind.schedule_many(calls, wait=False)
    assert batch.done()
    assert batch.failed() == [TaskKey("c2", _ms(when), "k"), TaskKey("c4", _ms(when), "k")]
    with pytest.raises(TaskLogUnavailableError, match="make the same call again"):
        batch.wait(1)


@pytest.mark.parametrize(("values", "plain"), [
    (("a", 1, True, None, 1.5, -0.0, "ünïcode ✓", 2**64 - 1, -(2**63)), True),
    ((math.nan,), False),
    ((math.inf,), False),
    ((-math.inf,), False),
    ((2**64,), False),  # beyond orjson's integers: the standard library's encoder writes it
    ((-(2**63) - 1,), False),
    (("lone \ud800 surrogate",), False),  # UTF-8 cannot carry it: refused when checked
    (([1],), False),  # containers take the full path
    ((decimal.Decimal(1),), False),
])
def test_plain_values_are_only_json_scalars_orjson_writes(values: tuple[Any, ...],
                                                         plain: bool) -> None:
    assert (plain_size(values) >= 0) is plain
    assert (plain_kwargs_size(dict(zip("abcdefghi", values, strict=False))) >= 0) is plain


def test_plain_kwargs_need_string_names_utf8_can_carry() -> None:
    assert plain_kwargs_size({1: "x"}) == -1  # type: ignore[dict-item]
    assert plain_kwargs_size({"\udc80": "x"}) == -1
    assert plain_kwargs_size({}) == 2


_scalars = st.one_of(
    st.text(), st.integers(-(2**63), 2**64 - 1), st.booleans(), st.none(),
    st.floats(allow_nan=False, allow_infinity=False))


@given(args=st.lists(_scalars, max_size=6),
       kwargs=st.dictionaries(st.text(max_size=8), _scalars, max_size=4),
       ordering=st.text(st.characters(max_codepoint=127, exclude_characters="\x00"),
                        min_size=1, max_size=20),
       unique=st.text(st.characters(max_codepoint=127, exclude_characters="\x00"),
                      min_size=1, max_size=20),
       scheduled_ms=st.integers(0, 2**64 - 1), enqueued_ms=st.integers(0, 2**64 - 1))
@example(args=[], kwargs={}, ordering="\x01", unique="\x1f", scheduled_ms=2**64 - 1,
         enqueued_ms=2**64 - 1)  # no slack anywhere: escaped keys, the longest times
@example(args=["\x01"], kwargs={"\x02": "\x03"}, ordering="\x01", unique="\x1f",
         scheduled_ms=2**64 - 1, enqueued_ms=2**64 - 1)
def test_the_bound_a_plain_call_is_checked_with_is_never_below_its_envelope(
        args: list[Any], kwargs: dict[str, Any], ordering: str, unique: str,
        scheduled_ms: int, enqueued_ms: int) -> None:
    # A plain call whose bound fits is not encoded when checked: its envelope must fit too.
    assume(all(_utf8(text) for text in [*kwargs, *(a for a in args if type(a) is str)]))
    assume(all(_utf8(v) for v in kwargs.values() if type(v) is str))
    encoder = ScheduleEncoder("proj.task", {"queue": "mail"}, RetryPolicy(), 10**9)
    data = encoder.encode(ordering, scheduled_ms, unique, args, kwargs, enqueued_ms,
                          plain=not kwargs)
    # as check_calls adds it up: a call without kwargs adds nothing for them
    bound = plain_size(args) + (plain_kwargs_size(kwargs) if kwargs else 0) + MAX_CHAR_BYTES * (
        len(ordering) + len(unique))
    assert 10**9 - encoder.room + bound >= len(data)


@scheduled_task(ordering_id="customer_id", uniqueness_key="step")
@app.task(name="unit.memo")
def memo(customer_id: str, step: str, text: str) -> None: ...


def test_a_call_whose_bound_is_over_the_limit_is_encoded_when_checked(
        scheduler: SchedulerTesting) -> None:
    # 1,000 characters may take 6,000 bytes, over the app's limit of 4,096: such a call is
    # encoded when it is checked, where one that is too large is refused with its index
    when = START + dt.timedelta(hours=1)
    batch = memo.schedule_many([(when, ("c1", "s1", "x" * 1000))])
    assert batch.count == 1 and len(scheduler.records()) == 1
    with pytest.raises(EnvelopeTooLargeError, match="call 1 of the batch"):
        memo.schedule_many([(when, ("c2", "s1", "x" * 1000)), (when, ("c2", "s2", "y" * 4000))])
    with pytest.raises(NotSerializableError, match="call 1 of the batch"):
        memo.schedule_many([(when, ("c2", "s1", "x")), (when, ("c2", "s2", "lone \udfff"))])
    assert len(scheduler.records()) == 1  # nothing of the refused batches


def _positional_only(a: str, b: int = 2, /, c: int = 3) -> None: ...


def _star(a: str, *rest: int, key: str = "k", **more: Any) -> None: ...


def _keyword_only(*, a: str, b: int) -> None: ...


@pytest.mark.parametrize(("function", "args", "kwargs"), [
    (_positional_only, ("x",), {}),
    (_positional_only, ("x", 5), {"c": 9}),
    (_star, ("x", 1, 2), {"key": "z", "extra": True}),
    (_star, ("x",), {}),
    (_keyword_only, (), {"b": 4, "a": "y"}),
])
def test_the_compiled_keys_are_those_the_arguments_give(function: Any, args: tuple[Any, ...],
                                                        kwargs: dict[str, Any]) -> None:
    binder = Binder(inspect.signature(function), function.__name__)
    def by_call(*a: Any, **k: Any) -> str:
        return repr((a, sorted(k.items())))

    first = next(iter(inspect.signature(function).parameters))
    keys_of = binder.compile_keys(("name", first), ("call", by_call))
    assert keys_of is not None
    arguments = binder.arguments(args, kwargs)
    assert keys_of(*args, **kwargs) == (arguments[first], binder.call_with(by_call, arguments))
    constant_keys = binder.compile_keys(("value", "fixed"), ("name", first))
    assert constant_keys is not None and constant_keys(*args, **kwargs) == ("fixed", arguments[first])


def test_a_call_the_compiled_keys_do_not_fit_raises_as_the_task_would() -> None:
    binder = Binder(inspect.signature(_keyword_only), "_keyword_only")
    keys_of = binder.compile_keys(("name", "a"), ("name", "b"))
    assert keys_of is not None
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'b'"):
        keys_of(a="x")
    assert binder.compile_keys(("name", "nope"), ("name", "b")) is None


@scheduled_task(ordering_id=lambda n: f"share-{100 // int(n)}", uniqueness_key="n")
@app.task(name="unit.share")
def share(n: str) -> None: ...


def test_a_key_function_that_fails_gets_the_error_schedule_gives(
        scheduler: SchedulerTesting) -> None:
    when = START + dt.timedelta(hours=1)
    with pytest.raises(InvalidKeyError, match="raised ZeroDivisionError") as one:
        share.schedule_at(when, "0")
    with pytest.raises(InvalidKeyError, match="raised ZeroDivisionError") as batched:
        share.schedule_many([(when, ("5",)), (when, ("0",))])
    assert str(batched.value) == f"call 1 of the batch ({(when, ('0',))!r:.120}): {one.value}"
    assert scheduler.records() == []
