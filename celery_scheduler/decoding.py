"""Reading envelopes back: :func:`decode` for what arrives on the task log, strict and total
(any byte string yields a valid envelope or raises
:class:`~celery_scheduler.errors.EnvelopeDecodeError` with the reason), and
:func:`decode_stored` for a task the scheduler stored after it passed :func:`decode`."""

from __future__ import annotations

import json
from typing import Any

import orjson

from celery_scheduler.envelope import (
    MAX_TASK_NAME,
    VERSION,
    CancelEnvelope,
    Envelope,
    RescheduleEnvelope,
    RetryEnvelope,
    RetryPolicy,
    ScheduleEnvelope,
    option_problem,
    reschedule_key_problem,
)
from celery_scheduler.errors import EnvelopeDecodeError, InvalidKeyError
from celery_scheduler.keys import MAX_MS, TaskKey, check_key_part

__all__ = ["decode", "decode_stored"]

_SCHEDULE_FIELDS = frozenset({"v", "type", "task", "key", "args", "kwargs", "options", "retry",
                              "enqueued_at"})
_KEY_ONLY_FIELDS = frozenset({"v", "type", "key", "enqueued_at"})  # cancel and retry
_RESCHEDULE_FIELDS = frozenset({"v", "type", "key", "to", "enqueued_at"})


def decode(data: bytes) -> Envelope:
    """Decode bytes from the topic into an envelope, or raise EnvelopeDecodeError.

    >>> env = decode(b'{"v":1,"type":"cancel","key":{"ordering_id":"a","at":5,"unique":"u"},'
    ...              b'"enqueued_at":1}')
    >>> env.key
    TaskKey(ordering_id='a', scheduled_ms=5, uniqueness_key='u')
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise EnvelopeDecodeError(f"record value must be bytes, got {type(data).__name__}")
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EnvelopeDecodeError(f"record is not UTF-8: {exc}") from None
    try:
        document = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except EnvelopeDecodeError:
        raise
    except (ValueError, RecursionError) as exc:
        raise EnvelopeDecodeError(f"record is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise EnvelopeDecodeError(f"envelope must be a JSON object, got {type(document).__name__}")
    version = document.get("v")
    if version != VERSION or isinstance(version, bool):
        raise EnvelopeDecodeError(f"unsupported envelope version {version!r} (expected {VERSION})")
    kind = document.get("type")
    if kind == "schedule":
        return _decode_schedule(document)
    if kind in ("cancel", "retry"):
        _exact_fields(document, _KEY_ONLY_FIELDS)
        kind_of = CancelEnvelope if kind == "cancel" else RetryEnvelope
        return kind_of(key=_decode_key(document["key"]),
                       enqueued_ms=_decode_ms(document["enqueued_at"], "enqueued_at"))
    if kind == "reschedule":
        _exact_fields(document, _RESCHEDULE_FIELDS)
        key = _decode_key(document["key"])
        to = _typed(document["to"], dict, "to")
        if to.get("v") != VERSION or to.get("type") != "schedule":
            raise EnvelopeDecodeError("to must be a schedule envelope of version "
                                      f"{VERSION}, got type {to.get('type')!r:.40}")
        envelope = _decode_schedule(to)
        problem = reschedule_key_problem(key, envelope.key)
        if problem is not None:
            raise EnvelopeDecodeError(problem)
        return RescheduleEnvelope(key, envelope, _decode_ms(document["enqueued_at"], "enqueued_at"))
    raise EnvelopeDecodeError(f"unknown envelope type {kind!r} (expected 'schedule', 'cancel', "
                              "'retry' or 'reschedule')")


def _decode_schedule(document: dict[str, Any]) -> ScheduleEnvelope:
    _exact_fields(document, _SCHEDULE_FIELDS)
    return ScheduleEnvelope(
        key=_decode_key(document["key"]),
        task=_decode_task_name(document["task"]),
        args=_typed(document["args"], list, "args"),
        kwargs=_typed(document["kwargs"], dict, "kwargs"),
        options=_decode_options(document["options"]),
        retry=_decode_retry(document["retry"]),
        enqueued_ms=_decode_ms(document["enqueued_at"], "enqueued_at"),
    )


# orjson reads an integer beyond 64 bits as a float, without a word (3.13: -2**63 - 1 came
# back as -9.223372036854776e+18): a document with a run of 19 digits, which every such
# integer has, is left to the strict decoder. Mapping every digit to "0" and looking for 19
# zeros in a row finds such a run a tenth as fast as a regular expression.
_DIGITS_AS_ZERO = bytes.maketrans(b"0123456789", b"0" * 10)
_LONG_RUN = b"0" * 19


def decode_stored(data: bytes) -> Envelope:
    """Decode a task the scheduler stored (a schedule row's envelope).

    Every stored envelope passed :func:`decode` when ingest accepted it, so its fields were
    checked then: this reads the document with orjson and builds the task without checking
    them again, a tenth of :func:`decode`'s time (the dispatcher reads every task once).
    Whatever is not such a document (another version, a damaged row, a number beyond 64
    bits) goes through :func:`decode`, which accepts it or says what is wrong.
    """
    if _LONG_RUN in data.translate(_DIGITS_AS_ZERO):
        return decode(data)
    try:
        document = orjson.loads(data)
        version = document["v"]
        if (type(version) is int and version == VERSION and document["type"] == "schedule"
                and document.keys() == _SCHEDULE_FIELDS):
            key, retry = document["key"], document["retry"]
            return ScheduleEnvelope.checked(
                TaskKey(key["ordering_id"], key["at"], key["unique"]), document["task"],
                document["args"], document["kwargs"], document["options"],
                RetryPolicy(retry["max_attempts"], retry["backoff"], retry["backoff_max"]),
                document["enqueued_at"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        pass
    return decode(data)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for name, value in pairs:
        if name in result:
            raise EnvelopeDecodeError(f"duplicate field {name!r}")
        result[name] = value
    return result


def _no_constant(name: str) -> Any:
    raise EnvelopeDecodeError(f"{name} is not valid JSON")


def _exact_fields(document: dict[str, Any], expected: frozenset[str]) -> None:
    missing = expected - document.keys()
    if missing:
        raise EnvelopeDecodeError(f"missing field(s) {sorted(missing)}")
    unknown = document.keys() - expected
    if unknown:
        raise EnvelopeDecodeError(f"unknown field(s) {sorted(unknown)}")


def _typed(value: Any, kind: type, what: str) -> Any:
    if not isinstance(value, kind):
        raise EnvelopeDecodeError(f"{what} must be a {kind.__name__}, got {type(value).__name__}")
    return value


def _decode_ms(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_MS:
        raise EnvelopeDecodeError(f"{what} must be epoch milliseconds, got {value!r}")
    return value


def _decode_key(value: Any) -> TaskKey:
    key = _typed(value, dict, "key")
    _exact_fields(key, frozenset({"ordering_id", "at", "unique"}))
    try:
        ordering_id = check_key_part(key["ordering_id"], "ordering id")
        unique = check_key_part(key["unique"], "uniqueness key")
    except InvalidKeyError as exc:
        raise EnvelopeDecodeError(str(exc)) from None
    return TaskKey(ordering_id, _decode_ms(key["at"], "key.at"), unique)


def _decode_task_name(value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_TASK_NAME:
        raise EnvelopeDecodeError(f"task must be a non-empty name, got {value!r:.80}")
    return value




def _decode_options(value: Any) -> dict[str, Any]:
    options: dict[str, Any] = _typed(value, dict, "options")
    for name, option in options.items():
        problem = option_problem(name, option)
        if problem is not None:
            raise EnvelopeDecodeError(problem)
        if name == "task_id":
            try:
                check_key_part(option, "task id")
            except InvalidKeyError as exc:
                raise EnvelopeDecodeError(str(exc)) from None
    return options


def _decode_retry(value: Any) -> RetryPolicy:
    retry = _typed(value, dict, "retry")
    _exact_fields(retry, frozenset({"max_attempts", "backoff", "backoff_max"}))
    try:
        return RetryPolicy(retry["max_attempts"], retry["backoff"], retry["backoff_max"])
    except ValueError as exc:
        raise EnvelopeDecodeError(f"retry: {exc}") from None
