"""The record that travels through Kafka and is stored in Cassandra: a versioned JSON envelope.

Three kinds exist, all keyed by the task key::

    {"v": 1, "type": "schedule", "task": "proj.tasks.remind",
     "key": {"ordering_id": "customer-42", "at": 1893456000000, "unique": "welcome"},
     "args": [...], "kwargs": {...}, "options": {"queue": "mail"},
     "retry": {"max_attempts": 5, "backoff": 1.0, "backoff_max": 600.0},
     "enqueued_at": 1893455000000}

    {"v": 1, "type": "cancel", "key": {...}, "enqueued_at": 1893455000000}

    {"v": 1, "type": "retry", "key": {...}, "enqueued_at": 1893455000000}

    {"v": 1, "type": "reschedule", "key": {...}, "to": {"v": 1, "type": "schedule", ...},
     "enqueued_at": 1893455000000}

A retry record re-arms a task that failed (see :meth:`ScheduleStore.retry`); a reschedule
record moves a pending task to another key of its ordering id, the schedule envelope it
holds (see :meth:`ScheduleStore.reschedule`). A dispatcher older than either sends it to the
dead letters as an unknown type.

Arguments are encoded with kombu's JSON, the encoding of Celery's default ``json``
serializer, so datetimes, UUIDs, Decimals and bytes arrive at the task as they would with
``apply_async``. Nothing is ever pickled.

Encoding is here; reading them back is :mod:`celery_scheduler.decoding`.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from celery_scheduler.arguments import encode_arguments
from celery_scheduler.errors import (
    EnvelopeTooLargeError,
    InvalidKeyError,
    NotSerializableError,
)
from celery_scheduler.keys import TaskKey

__all__ = [
    "CELERY_OPTIONS",
    "VERSION",
    "CancelEnvelope",
    "Envelope",
    "RescheduleEnvelope",
    "RetryEnvelope",
    "RetryPolicy",
    "ScheduleEncoder",
    "ScheduleEnvelope",
    "encode",
    "encode_arguments",
    "option_problem",
    "reschedule_key_problem",
]

VERSION = 1
MAX_TASK_NAME = 512

# Celery options kept with the task and passed to ``send_task`` at release, with the JSON
# types each accepts.
CELERY_OPTIONS: dict[str, tuple[type, ...]] = {
    "queue": (str,),
    "routing_key": (str,),
    "exchange": (str,),
    "priority": (int,),
    "time_limit": (int, float),
    "soft_time_limit": (int, float),
    # Seconds after the scheduled time: the dispatcher expires a task it could not release by
    # then (its status ``expired``), and Celery's worker one it receives later.
    "expires": (int, float),
    "headers": (dict,),
    "shadow": (str,),
    # the Celery task id every run uses, instead of the one derived from the task key (the
    # drop-in eta mode keeps the id apply_async returned)
    "task_id": (str,),
}


@dataclass(frozen=True)
class RetryPolicy:
    """How the dispatcher retries a failed task: jittered exponential backoff, then give up."""

    max_attempts: int = 5
    backoff: float = 1.0
    backoff_max: float = 600.0

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) or (
            self.max_attempts < 1
        ):
            raise ValueError(f"max_attempts must be an integer >= 1, got {self.max_attempts!r}")
        for name in ("backoff", "backoff_max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                math.isfinite(value) and value >= 0
            ):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")

    def as_json(self) -> dict[str, Any]:
        return {"max_attempts": self.max_attempts, "backoff": float(self.backoff),
                "backoff_max": float(self.backoff_max)}


@dataclass(frozen=True)
class ScheduleEnvelope:
    """A task to run at ``key.scheduled_ms``: task name, JSON arguments and Celery options."""

    key: TaskKey
    task: str
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    enqueued_ms: int = 0
    type: str = field(default="schedule", init=False)

    @classmethod
    def checked(cls, key: TaskKey, task: str, args: list[Any], kwargs: dict[str, Any],
                options: dict[str, Any], retry: RetryPolicy, enqueued_ms: int
                ) -> ScheduleEnvelope:
        """The envelope of fields already checked, made without the frozen ``__init__``.

        A frozen dataclass sets each field through ``object.__setattr__``: a tenth of a
        schedule call. The fields here are the same, and the envelope as frozen.
        """
        envelope = object.__new__(cls)
        envelope.__dict__.update(key=key, task=task, args=args, kwargs=kwargs, options=options,
                                 retry=retry, enqueued_ms=enqueued_ms, type="schedule")
        return envelope

    @property
    def task_id(self) -> str:
        """The Celery task id its runs use: the ``task_id`` option, or the key's own."""
        chosen = self.options.get("task_id")
        return chosen if isinstance(chosen, str) else self.key.task_id

    def as_json(self) -> dict[str, Any]:
        return {"v": VERSION, "type": "schedule", "task": self.task, "key": _key_json(self.key),
                "args": self.args, "kwargs": self.kwargs, "options": self.options,
                "retry": self.retry.as_json(), "enqueued_at": self.enqueued_ms}


@dataclass(frozen=True)
class CancelEnvelope:
    """A request to cancel the pending task with ``key``."""

    key: TaskKey
    enqueued_ms: int = 0
    type: str = field(default="cancel", init=False)

    def as_json(self) -> dict[str, Any]:
        return {"v": VERSION, "type": "cancel", "key": _key_json(self.key),
                "enqueued_at": self.enqueued_ms}


@dataclass(frozen=True)
class RetryEnvelope:
    """A request to run the failed task with ``key`` once more (an operator's retry)."""

    key: TaskKey
    enqueued_ms: int = 0
    type: str = field(default="retry", init=False)

    def as_json(self) -> dict[str, Any]:
        return {"v": VERSION, "type": "retry", "key": _key_json(self.key),
                "enqueued_at": self.enqueued_ms}


@dataclass(frozen=True)
class RescheduleEnvelope:
    """A request to move the pending task with ``key`` to ``to``: another time of the same
    ordering id and uniqueness key, and maybe other arguments."""

    key: TaskKey
    to: ScheduleEnvelope
    enqueued_ms: int = 0
    type: str = field(default="reschedule", init=False)

    def __post_init__(self) -> None:
        problem = reschedule_key_problem(self.key, self.to.key)
        if problem is not None:
            raise InvalidKeyError(problem)

    def as_json(self) -> dict[str, Any]:
        return {"v": VERSION, "type": "reschedule", "key": _key_json(self.key),
                "to": self.to.as_json(), "enqueued_at": self.enqueued_ms}


def reschedule_key_problem(key: TaskKey, to: TaskKey) -> str | None:
    """Why *key* cannot move to *to*; None if it can (same ordering id and uniqueness key,
    another time)."""
    if (to.ordering_id, to.uniqueness_key) != (key.ordering_id, key.uniqueness_key):
        return (f"a reschedule keeps the ordering id and uniqueness key of {key}, but was "
                f"given {to}: cancel it and schedule the other key instead")
    if to.scheduled_ms == key.scheduled_ms:
        return (f"{key} is scheduled at that time already: to change only its arguments, "
                "schedule the same key again while it is pending")
    return None


Envelope = ScheduleEnvelope | CancelEnvelope | RetryEnvelope | RescheduleEnvelope


def _key_json(key: TaskKey) -> dict[str, Any]:
    return {"ordering_id": key.ordering_id, "at": key.scheduled_ms, "unique": key.uniqueness_key}


# --- encoding ----------------------------------------------------------------------------


def encode(envelope: Envelope, max_bytes: int | None = None) -> bytes:
    """Encode *envelope* as canonical UTF-8 JSON, enforcing *max_bytes* when given."""
    document = envelope.as_json()
    try:
        # orjson writes the same compact, key-sorted UTF-8 several times faster; it refuses
        # integers beyond 64 bits, which the standard library then encodes
        data = orjson.dumps(document, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        try:
            data = json.dumps(document, ensure_ascii=False, allow_nan=False,
                              separators=(",", ":"), sort_keys=True).encode("utf-8")
        except (TypeError, ValueError, RecursionError) as exc:
            raise NotSerializableError(
                f"task {envelope.key} cannot be encoded as JSON: {exc}") from exc
    if max_bytes is not None and len(data) > max_bytes:
        raise _too_large(envelope.key, len(data), max_bytes)
    return data


def _too_large(key: Any, size: int, max_bytes: int) -> EnvelopeTooLargeError:
    return EnvelopeTooLargeError(
        f"task {key} encodes to {size} bytes, over the limit of {max_bytes} "
        "(scheduler_max_envelope_bytes); pass a reference such as a row id instead of "
        "the data, or raise the limit (and Kafka's max.message.bytes with it)"
    )


# A call's own fields with empty key parts and args, no kwargs, and its two times (at most
# 20 digits each), as ScheduleEncoder writes them before the shared fields.
_OWN_FIELDS_MAX = len(orjson.dumps({"args": 0, "enqueued_at": 0,
                                    "key": {"at": 0, "ordering_id": "", "unique": ""},
                                    "kwargs": {}})) - 1 - 3 + 2 * 20


class ScheduleEncoder:
    """Encodes the schedule envelopes of one task with one set of options and retry policy.

    Every such envelope shares its last fields in sorted order (``options``, ``retry``,
    ``task``, ``type``, ``v``): they are encoded once, and each call encodes only its own
    (``args``, ``enqueued_at``, ``key``, ``kwargs``), which sort before them. The bytes are
    those :func:`encode` writes for the same envelope.
    """

    __slots__ = ("_shared", "max_bytes", "options", "retry", "room", "task")

    def __init__(self, task: str, options: dict[str, Any], retry: RetryPolicy,
                 max_bytes: int | None = None) -> None:
        self.task, self.options, self.retry, self.max_bytes = task, options, retry, max_bytes
        try:
            shared = orjson.dumps({"options": options, "retry": retry.as_json(), "task": task,
                                   "type": "schedule", "v": VERSION}, option=orjson.OPT_SORT_KEYS)
        except TypeError:  # an integer beyond 64 bits in the options: encode() each time
            self._shared: bytes | None = None
            self.room = -1
        else:
            self._shared = b"," + shared[1:]
            # A call whose arguments take at most *room* bytes (plain_size's bound of its
            # args, plain_kwargs_size's of its kwargs if it has any, plus MAX_CHAR_BYTES per
            # character of its key parts) is within max_bytes without being encoded: the
            # rest of its envelope is this long at most.
            fixed = len(self._shared) + _OWN_FIELDS_MAX
            self.room = sys.maxsize if max_bytes is None else max_bytes - fixed

    def encode(self, ordering_id: str, scheduled_ms: int, uniqueness_key: str,
               args: Sequence[Any], kwargs: Mapping[str, Any], enqueued_ms: int, *,
               plain: bool = False) -> bytes:
        """The envelope of one call, whose key parts were checked and whose arguments are
        JSON values (a tuple is written as a list).

        *plain*: the arguments are JSON scalars and there are no kwargs, so nothing needs
        sorting (the fields are written in sorted order) and ``orjson`` skips it."""
        shared = self._shared
        if shared is not None:
            try:
                own = orjson.dumps({"args": args, "enqueued_at": enqueued_ms,
                                    "key": {"at": scheduled_ms, "ordering_id": ordering_id,
                                            "unique": uniqueness_key},
                                    "kwargs": kwargs},
                                   option=None if plain else orjson.OPT_SORT_KEYS)
            except TypeError:
                pass
            else:
                data = own[:-1] + shared
                if self.max_bytes is not None and len(data) > self.max_bytes:
                    raise _too_large(TaskKey(ordering_id, scheduled_ms, uniqueness_key),
                                     len(data), self.max_bytes)
                return data
        return encode(ScheduleEnvelope.checked(
            TaskKey(ordering_id, scheduled_ms, uniqueness_key), self.task, list(args),
            dict(kwargs), self.options, self.retry, enqueued_ms), self.max_bytes)

def option_problem(name: str, value: Any) -> str | None:
    """Why *value* cannot be the Celery option *name* of a scheduled task; None if it can.

    The one check of options, for the schedule call and for the dispatcher's decoder.
    """
    kinds = CELERY_OPTIONS.get(name)
    if kinds is None:
        return (f"unknown Celery option {name!r}; scheduled tasks accept "
                + ", ".join(sorted(CELERY_OPTIONS)))
    if isinstance(value, bool) or not isinstance(value, kinds) or (
            isinstance(value, float) and not math.isfinite(value)):
        return (f"Celery option {name}={value!r:.80} should be "
                + " or ".join(("finite " if kind is float else "") + kind.__name__ for kind in kinds))
    return None

