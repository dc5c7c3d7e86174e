"""Many calls of one task scheduled at once: ``task.schedule_many(calls)``.

::

    batch = send_reminder.schedule_many(
        (when, (customer_id,), {"reminder_kind": "trial-ends"}) for customer_id, when in rows)
    batch.count          # calls scheduled
    batch.keys           # their task keys, in order

Each call is checked as ``schedule`` checks it, and every call before any is published: a
call ``schedule`` would refuse raises its error, naming the call's index, and nothing of the
batch goes to Kafka. The calls share the task's options and retry policy, so the part of
the envelope they share is encoded once; each call's own part is encoded as the producer
takes its record (Kafka writes the first while the last are encoded), and Kafka's
acknowledgements come back as one.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

from celery_scheduler.arguments import MAX_CHAR_BYTES, plain_kwargs_size, plain_size
from celery_scheduler.calls import check_options, check_retry, expiry_options, scheduled_ms_of
from celery_scheduler.client import SchedulerClient
from celery_scheduler.decoding import decode
from celery_scheduler.envelope import RetryPolicy, ScheduleEncoder
from celery_scheduler.errors import ScheduleError, ScheduleTimeError
from celery_scheduler.keys import MAX_KEY_LENGTH, KeyInput, TaskKey, key_text
from celery_scheduler.tasklog.base import BatchAck
from celery_scheduler.tracing import traced_options

__all__ = ["Call", "CheckedCalls", "ScheduledBatch", "check_calls"]

_NO_KWARGS: Mapping[str, Any] = MappingProxyType({})
_EMPTY: dict[str, Any] = {}  # the kwargs of a call without them; never changed
_UNSET = object()


class Call(NamedTuple):
    """One call of ``schedule_many``: run ``task(*args, **kwargs)`` at *at* (a datetime).

    A plain tuple ``(at, args)`` or ``(at, args, kwargs)`` is the same.
    """

    at: dt.datetime
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = _NO_KWARGS


class ScheduledBatch:
    """What ``schedule_many`` returns: the calls' task keys and Kafka's acknowledgement."""

    def __init__(self, task: str, calls: CheckedCalls, ack: BatchAck) -> None:
        self.task = task
        self._calls = calls
        self._ack = ack

    @property
    def count(self) -> int:
        """How many calls the batch scheduled."""
        return len(self._calls)

    @property
    def keys(self) -> list[TaskKey]:
        """The calls' task keys, in the order of the calls (for status and cancel)."""
        return self._calls.keys()

    def done(self) -> bool:
        """Whether Kafka answered for every call (acknowledged it, or failed it)."""
        return self._ack.done()

    def wait(self, timeout: float | None = None) -> None:
        """Block until Kafka acknowledged every call.

        Raises :class:`~celery_scheduler.errors.TaskLogUnavailableError` if some were not
        (:meth:`failed` lists them) or after *timeout* seconds. Scheduling the same calls
        again is safe: a task key runs once.
        """
        self._ack.wait(timeout)

    def failed(self) -> list[TaskKey]:
        """The keys of the calls Kafka did not acknowledge (complete once :meth:`done`)."""
        return [decode(value).key for _, value in self._ack.failed() if value]

    def __repr__(self) -> str:
        state = "acknowledged" if self.done() else "pending"
        return f"<ScheduledBatch {self.task} {self.count} call(s), {state}>"


# A checked call: ordering id, time, uniqueness key, then its args and kwargs (a plain call,
# encoded when produced) or its envelope and None (encoded when checked).
_Checked = tuple[str, int, str, Any, Any]


class CheckedCalls(Collection[tuple[str, bytes]]):
    """A batch's checked calls, as the records Kafka takes: (ordering id, envelope).

    Every check, the envelope's size included, was made: a plain call's envelope is encoded
    only as its record is taken, so that Kafka takes the first records of a batch while the
    last are being encoded.
    """

    __slots__ = ("_calls", "_current", "_encode")

    def __init__(self, calls: list[_Checked], encoder: ScheduleEncoder, current: int) -> None:
        self._calls, self._encode, self._current = calls, encoder.encode, current

    def __len__(self) -> int:
        return len(self._calls)

    def __iter__(self) -> Iterator[tuple[str, bytes]]:
        encode, current = self._encode, self._current
        for ordering, scheduled_ms, unique, args, kwargs in self._calls:
            if kwargs is None:
                yield ordering, args
            else:
                yield ordering, encode(ordering, scheduled_ms, unique, args, kwargs, current,
                                       plain=not kwargs)

    def __contains__(self, record: object) -> bool:
        return any(record == taken for taken in self)

    def keys(self) -> list[TaskKey]:
        """The calls' task keys, in order."""
        return [TaskKey(ordering, at, unique) for ordering, at, unique, _, _ in self._calls]


def _at_call(error: ScheduleError, index: int, call: Any) -> ScheduleError:
    """*error*, of its own type, saying which call of the batch it is about."""
    return type(error)(f"call {index} of the batch ({call!r:.120}): {error}")


class CheckedTask(Protocol):
    """What :func:`check_calls` reads of a scheduled task (``api.ScheduledTask``)."""

    name: str
    task: Any  # Celery's task: its own expires= is the calls' default
    _retry: RetryPolicy | None
    # both keys of a call from its arguments, when the decorator gives both
    _keys_of: Callable[..., tuple[Any, Any]] | None

    def _checked(self, args: Sequence[Any], kwargs: Mapping[str, Any], ordering_id: KeyInput | None,
                 uniqueness_key: KeyInput | None) -> tuple[str, str, list[Any], dict[str, Any]]: ...


def check_calls(task: CheckedTask, calls: Iterable[Any], client: SchedulerClient,
                timezone: Any, retry: RetryPolicy | None, options: Mapping[str, Any]
                ) -> CheckedCalls:
    """Check every call as ``schedule`` would, or raise its error naming its index."""
    check_retry(retry)
    if isinstance(calls, (str, bytes, Mapping)) or not isinstance(calls, Iterable):
        raise ScheduleError(
            f"calls must be an iterable of (at, args) or (at, args, kwargs), got "
            f"{type(calls).__name__} {calls!r:.200}")
    settings = client.settings
    current = client.clock()
    grace = settings.grace_seconds
    if settings.opentelemetry:  # the batch's calls share the caller's trace context
        options = traced_options(options, settings)
    # the calls share their options: expires in seconds after each one's time, not a datetime
    options = expiry_options(options, task.task.expires, None) or {}
    encoder = ScheduleEncoder(task.name, check_options(options) if options else {},
                              retry or task._retry or settings.retry_policy,
                              settings.max_envelope_bytes)
    encode, check, room = encoder.encode, task._checked, encoder.room
    # The usual call (plain JSON values; keys from the decorator) is checked here inline, at
    # a third of the cost of schedule()'s checks, which take every other call; its envelope
    # is encoded later, when produced, unless it may be too large (see plain_size).
    keys_of = task._keys_of
    checked: list[_Checked] = []
    last_at: Any = _UNSET
    scheduled_ms = 0
    for index, call in enumerate(calls):
        try:
            size = len(call) if type(call) is tuple or isinstance(call, (tuple, list)) else 0
            if size == 2:
                (at, args), kwargs = call, _EMPTY
            elif size == 3:
                at, args, kwargs = call
                if type(kwargs) is not dict and not kwargs:
                    kwargs = _EMPTY  # Call's default: checked at dict speed
            else:
                raise ScheduleError(
                    "a call must be (at, args) or (at, args, kwargs), such as "
                    "celery_scheduler.Call(at, args, kwargs)")
            if at is not last_at:  # calls often share a time: read it once
                if at is None:
                    raise ScheduleTimeError("the call has no time: give a datetime")
                scheduled_ms = scheduled_ms_of(at, None, current, timezone, grace)
                last_at = at
            if keys_of is not None and (type(args) is tuple or type(args) is list) \
                    and type(kwargs) is dict:
                size = plain_size(args)
                if kwargs and size >= 0:
                    named = plain_kwargs_size(kwargs)
                    size = named + size if named >= 0 else -1
                if size >= 0:
                    try:
                        ordering, unique = keys_of(*args, **kwargs) if kwargs else keys_of(*args)
                    except Exception:  # a call that does not fit, a key function that fails
                        ordering = None  # check() says why, as schedule() would
                    if ordering is not None:
                        if not (type(ordering) is str and 0 < len(ordering) <= MAX_KEY_LENGTH
                                and ordering.isascii() and "\x00" not in ordering):
                            ordering = key_text(ordering, "ordering id")
                        if not (type(unique) is str and 0 < len(unique) <= MAX_KEY_LENGTH
                                and unique.isascii() and "\x00" not in unique):
                            unique = key_text(unique, "uniqueness key")
                        if size + MAX_CHAR_BYTES * (len(ordering) + len(unique)) <= room:
                            checked.append((ordering, scheduled_ms, unique, args, kwargs))
                        else:  # it may not fit: encoded now, to know
                            checked.append((ordering, scheduled_ms, unique, encode(
                                ordering, scheduled_ms, unique, args, kwargs, current,
                                plain=not kwargs), None))
                        continue
            ordering, unique, encoded_args, encoded_kwargs = check(args, kwargs, None, None)
            checked.append((ordering, scheduled_ms, unique, encode(
                ordering, scheduled_ms, unique, encoded_args, encoded_kwargs, current), None))
        except ScheduleError as exc:
            raise _at_call(exc, index, call) from exc
    return CheckedCalls(checked, encoder, current)
