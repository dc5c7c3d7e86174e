"""Delayed Kafka messages: ``schedule_message`` has a dispatcher produce a message to a topic
when it is due.

The delayed-queue use case: instead of running a Celery task, the dispatcher that owns the
message's ordering id produces it to *topic* at the time (an idempotent producer,
``acks=all``). In every other way it is a scheduled task: one at a time and in order per
ordering id, deduplicated by its uniqueness key, cancellable until it is released, tried
again with backoff when Kafka does not take it, and ``succeeded`` once Kafka acknowledged
it. At least once: a dispatcher that dies after Kafka took the message and before it
recorded so produces it again when the release's lease ends.

::

    from celery_scheduler import schedule_message

    handle = schedule_message("invoices.due", b'{"invoice": 42}', key=b"customer-42",
                              countdown=3600, ordering_id="customer-42", app=app)
    handle.status()   # pending, released, succeeded, failed or cancelled
    handle.cancel()
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from celery_scheduler.calls import call_digest, check_retry, scheduled_ms_of
from celery_scheduler.client import get_client
from celery_scheduler.envelope import RetryPolicy, ScheduleEnvelope
from celery_scheduler.errors import EnvelopeDecodeError, ScheduleError
from celery_scheduler.handles import ScheduleHandle
from celery_scheduler.keys import KeyInput, TaskKey, key_text

__all__ = ["MESSAGE_TASK", "DelayedMessage", "schedule_message"]

# The task name of a delayed message's envelope: no Celery task has it.
MESSAGE_TASK = "celery_scheduler.kafka_message"
# Kafka's rule for topic names.
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
# Headers written on each delivered message: the task key it was scheduled under.
KEY_HEADER = "celery_scheduler_key"


def _bytes(value: object, what: str) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise ScheduleError(f"the message's {what} must be bytes or text, got "
                        f"{type(value).__name__} {value!r:.100}")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: object) -> bytes:
    if not isinstance(text, str):
        raise EnvelopeDecodeError(f"expected base64 text, got {type(text).__name__}")
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error as exc:
        raise EnvelopeDecodeError(f"not base64: {exc}") from None


@dataclass(frozen=True)
class DelayedMessage:
    """What a dispatcher produces: topic, value, key and headers."""

    topic: str
    value: bytes
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()

    @classmethod
    def make(cls, topic: object, value: object, key: object = None,
             headers: Mapping[str, object] | Sequence[tuple[str, object]] | None = None) -> DelayedMessage:
        """Validate a schedule_message call's message (ScheduleError, saying what is wrong)."""
        if not isinstance(topic, str) or not _TOPIC.match(topic):
            raise ScheduleError(f"topic {topic!r:.100} is not a Kafka topic name: use 1 to 249 "
                                "letters, digits, '.', '_' or '-'")
        pairs = list(headers.items()) if isinstance(headers, Mapping) else list(headers or ())
        checked = []
        for pair in pairs:
            if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)):
                raise ScheduleError(f"message headers must be a mapping or (name, value) pairs "
                                    f"with text names, got {pair!r:.100}")
            checked.append((pair[0], _bytes(pair[1], f"header {pair[0]!r}")))
        return cls(topic, _bytes(value, "value"), None if key is None else _bytes(key, "key"),
                   tuple(checked))

    def args(self) -> list[Any]:
        """The message as an envelope's arguments (JSON: base64 for the bytes)."""
        return [self.topic, _b64(self.value), None if self.key is None else _b64(self.key),
                [[name, _b64(value)] for name, value in self.headers]]

    @classmethod
    def of(cls, envelope: ScheduleEnvelope) -> DelayedMessage:
        """The message an envelope carries; EnvelopeDecodeError if it is not a valid one."""
        args = envelope.args
        if envelope.kwargs or not isinstance(args, list) or len(args) != 4:
            raise EnvelopeDecodeError(f"a {MESSAGE_TASK} envelope takes [topic, value, key, "
                                      f"headers] and no kwargs, got {args!r:.200}")
        topic, value, key, headers = args
        if not isinstance(topic, str) or not _TOPIC.match(topic):
            raise EnvelopeDecodeError(f"{topic!r:.100} is not a Kafka topic name")
        if not isinstance(headers, list) or not all(
                isinstance(h, list) and len(h) == 2 and isinstance(h[0], str) for h in headers):
            raise EnvelopeDecodeError(f"message headers must be [name, base64] pairs, got "
                                      f"{headers!r:.200}")
        return cls(topic, _unb64(value), None if key is None else _unb64(key),
                   tuple((name, _unb64(data)) for name, data in headers))


def schedule_message(topic: str, value: bytes | str, *, key: bytes | str | None = None,
                     headers: Mapping[str, bytes | str] | Sequence[tuple[str, bytes | str]] | None = None,
                     at: dt.datetime | None = None, countdown: float | dt.timedelta | None = None,
                     ordering_id: KeyInput, uniqueness_key: KeyInput | None = None,
                     retry: RetryPolicy | None = None, app: Any = None, wait: bool = True
                     ) -> ScheduleHandle:
    """Produce *value* to *topic* (with *key* and *headers*) at *at* or after *countdown*.

    Exactly one of *at* and *countdown*. Messages of one *ordering_id* are produced one at a
    time, in schedule order; a second call with the same time and *uniqueness_key* (by
    default, a digest of the message) is dropped. *app* is the Celery app whose scheduler
    settings to use (Celery's current app if None). Returns once Kafka acknowledged the
    schedule call (``wait=False``: at once; ``flush(app)`` waits).
    """
    if app is None:
        from celery import current_app

        app = current_app._get_current_object()  # type: ignore[attr-defined]  # the proxy's
    client = get_client(app)
    settings = client.settings
    message = DelayedMessage.make(topic, value, key, headers)
    current = client.clock()
    when = scheduled_ms_of(at, countdown, current, app.timezone, settings.grace_seconds)
    check_retry(retry)
    args = message.args()
    unique = (key_text(uniqueness_key, "uniqueness key") if uniqueness_key is not None
              else call_digest(MESSAGE_TASK, args, {}))
    envelope = ScheduleEnvelope(
        key=TaskKey(key_text(ordering_id, "ordering id"), when, unique), task=MESSAGE_TASK,
        args=args, kwargs={}, options={}, retry=retry or settings.retry_policy,
        enqueued_ms=current)
    return ScheduleHandle(client, envelope, client.publish(envelope, wait=wait), app=app)
