from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import json
import re
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celery_scheduler.decoding import decode, decode_stored
from celery_scheduler.envelope import CancelEnvelope, RetryPolicy, ScheduleEnvelope, encode, encode_arguments
from celery_scheduler.errors import EnvelopeDecodeError, EnvelopeTooLargeError, NotSerializableError
from celery_scheduler.keys import TaskKey
from tests.unit.budget import examples

KEY = TaskKey("customer-42", 1_893_456_000_000, "welcome")


def schedule(**changes: object) -> ScheduleEnvelope:
    fields: dict[str, object] = {
        "key": KEY, "task": "proj.tasks.remind", "args": ["customer-42"],
        "kwargs": {"kind": "welcome"}, "options": {"queue": "mail"},
        "retry": RetryPolicy(3, 0.5, 30.0), "enqueued_ms": 1_893_455_000_000,
    }
    fields.update(changes)
    return ScheduleEnvelope(**fields)  # type: ignore[arg-type]


def test_schedule_envelope_round_trips() -> None:
    envelope = schedule()
    assert decode(encode(envelope)) == envelope


def test_cancel_envelope_round_trips() -> None:
    envelope = CancelEnvelope(KEY, 5)
    assert decode(encode(envelope)) == envelope


def test_encoding_is_canonical_json() -> None:
    data = encode(schedule())
    assert json.loads(data)["v"] == 1
    assert encode(schedule()) == data  # stable bytes for the same envelope


def test_unicode_survives() -> None:
    envelope = schedule(key=TaskKey("клиент-42 🚀", 1, "ü"), args=["日本語"])
    assert decode(encode(envelope)) == envelope


def test_celery_json_types_are_tagged_for_the_worker() -> None:
    when = dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    ident = uuid.UUID(int=7)
    args, kwargs = encode_arguments([when, ident], {"amount": decimal.Decimal("1.10")})
    # plain JSON values, which kombu's JSON decoder turns back into the original types
    from kombu.utils.json import loads

    assert loads(json.dumps([args, kwargs])) == [[when, ident], {"amount": decimal.Decimal("1.10")}]


@pytest.mark.parametrize(
    ("args", "kwargs", "where"),
    [
        ([object()], {}, "args[0]"),
        ([], {"user": {"ok": 1, "bad": {1, 2}}}, "kwargs['user']['bad']"),
        ([float("nan")], {}, "args[0]"),
        ([], {"limit": float("inf")}, "kwargs['limit']"),
        ([], {"x": [1, 2, lambda: None]}, "kwargs['x'][2]"),
    ],
)
def test_unserializable_arguments_name_the_offending_value(args, kwargs, where) -> None:
    with pytest.raises(NotSerializableError, match=re.escape(where)):
        encode_arguments(args, kwargs)


def test_non_string_keyword_names_are_refused() -> None:
    with pytest.raises(NotSerializableError, match="1"):
        encode_arguments([], {1: "x"})


def test_size_limit_is_enforced_with_the_size_in_the_message() -> None:
    envelope = schedule(args=["x" * 5000])
    with pytest.raises(EnvelopeTooLargeError, match=r"over the limit of 1000"):
        encode(envelope, max_bytes=1000)
    assert decode(encode(envelope, max_bytes=10_000)) == envelope


VALID = json.loads(encode(schedule()))


def mutated(**changes: object) -> bytes:
    document = {**VALID, **changes}
    return json.dumps({k: v for k, v in document.items() if v is not ...}).encode()


# Records that are no task at all, of another version or missing part of one: the strict
# decoder refuses them, and the decoder of stored tasks hands them to it.
NOT_A_TASK = [
    (b"\xff\xfe", "not UTF-8"),
    (b"{not json", "not JSON"),
    (b"[]", "JSON object"),
    (b'{"v": NaN}', "NaN"),
    (b"[" * 100_000 + b"]" * 100_000, "not JSON"),
    (mutated(v=2), "version 2"),
    (mutated(v=True), "version True"),
    (mutated(type="explode"), "unknown envelope type"),
    (mutated(extra=1), "unknown field"),
    (mutated(retry=...), "missing field"),
    (mutated(key={"ordering_id": "a", "unique": "u"}), "missing field"),
    (mutated(retry={"max_attempts": 0, "backoff": 1, "backoff_max": 1}), "max_attempts"),
]


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        *NOT_A_TASK,
        (b'{"v": 1, "v": 1}', "duplicate"),
        (mutated(task=""), "task must be"),
        (mutated(task=5), "task must be"),
        (mutated(args={}), "args must be a list"),
        (mutated(kwargs=[]), "kwargs must be a dict"),
        (mutated(key={"ordering_id": "", "at": 1, "unique": "u"}), "must not be empty"),
        (mutated(key={"ordering_id": 5, "at": 1, "unique": "u"}), "must be a string"),
        (mutated(key={"ordering_id": "a", "at": -1, "unique": "u"}), "epoch milliseconds"),
        (mutated(key={"ordering_id": "a", "at": 1.5, "unique": "u"}), "epoch milliseconds"),
        (mutated(key={"ordering_id": "a", "at": True, "unique": "u"}), "epoch milliseconds"),
        (mutated(options={"serializer": "pickle"}), "unknown Celery option"),
        (mutated(options={"priority": "high"}), "should be int"),
        (mutated(options={"task_id": ""}), "task id must not be empty"),
        (mutated(options={"task_id": "x" * 2000}), "task id is 2000 characters long"),
        (mutated(enqueued_at="yesterday"), "enqueued_at"),
    ],
)
def test_invalid_records_raise_the_typed_error(data: bytes, reason: str) -> None:
    with pytest.raises(EnvelopeDecodeError) as caught:
        decode(data)
    assert reason in caught.value.reason


@settings(max_examples=examples(2000), deadline=None)
@given(st.binary(max_size=512))
def test_decoding_arbitrary_bytes_is_total(data: bytes) -> None:
    with contextlib.suppress(EnvelopeDecodeError):
        decode(data)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=examples(500), deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(VALID)), json_values, max_size=9))
def test_decoding_arbitrary_json_objects_is_total(document: dict[str, object]) -> None:
    with contextlib.suppress(EnvelopeDecodeError):
        decode(json.dumps(document).encode())


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(json_values, max_size=5), st.dictionaries(st.text(max_size=10), json_values, max_size=5))
def test_any_json_arguments_round_trip(args: list[object], kwargs: dict[str, object]) -> None:
    encoded_args, encoded_kwargs = encode_arguments(args, kwargs)
    envelope = schedule(args=encoded_args, kwargs=encoded_kwargs)
    assert decode(encode(envelope)) == envelope


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(json_values, max_size=5), st.dictionaries(st.text(max_size=10), json_values, max_size=5),
       st.sampled_from([{}, {"queue": "mail", "priority": 3}, {"headers": {"h": [1, None]}}]))
def test_a_stored_task_decodes_as_the_strict_decoder_reads_it(
        args: list[object], kwargs: dict[str, object], options: dict[str, object]) -> None:
    encoded_args, encoded_kwargs = encode_arguments(args, kwargs)
    data = encode(schedule(args=encoded_args, kwargs=encoded_kwargs, options=options))
    assert decode_stored(data) == decode(data)


@pytest.mark.parametrize(("data", "reason"), NOT_A_TASK)
def test_a_stored_task_that_is_not_one_is_named_by_the_strict_decoder(data: bytes, reason: str
                                                                       ) -> None:
    with pytest.raises(EnvelopeDecodeError) as caught:
        decode_stored(data)
    assert reason in caught.value.reason


def test_a_stored_task_beyond_what_orjson_reads_is_read_by_the_strict_decoder() -> None:
    for big in (2 ** 70 + 1, -2 ** 63 - 1, 2 ** 64, 10 ** 30):
        data = encode(schedule(args=[big], kwargs={"n": -big}))
        assert decode_stored(data) == decode(data)
        stored = decode_stored(data)
        assert isinstance(stored, ScheduleEnvelope)
        # ints, not floats that happen to compare equal
        assert [type(stored.args[0]), type(stored.kwargs["n"])] == [int, int], big
        assert stored.args == [big] and stored.kwargs == {"n": -big}
    cancel = encode(CancelEnvelope(KEY, enqueued_ms=5))
    assert decode_stored(cancel) == decode(cancel)
