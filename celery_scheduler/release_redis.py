"""The Redis side of a release: push a released task's Celery message onto its queue's list.

kombu's Redis transport stores a message as one JSON document (its body base64-encoded)
pushed on the left of the queue's list, which Celery workers pop on the right. A release
through kombu's ``Producer.publish`` builds that document through four layers (Celery's
``send_task_message``, the producer, the virtual channel, the publish batch), each with
its own options handling, in pure Python. :class:`RedisPush` builds the same document from
Celery's own message (``amqp.create_task_message``, routed by Celery's router), encodes it
with orjson, and pushes the documents of a step in one pipeline: a third less CPU per
release in steps of 100, a sixth one at a time (``python -m benchmarks.publish_cost``).

It takes only the plain case; anything else goes through kombu as before:

- a queue on a direct exchange, sent to the queue itself (what Celery does for every queue
  it routes to on Redis), whose first message of a connection has declared it;
- no compression, no ``task-sent`` event, no receivers of Celery's deprecated ``task_sent``;
- no queue with a Redis expiry (``x-expires``), no ``mandatory``, ``immediate`` or
  explicit content type.

Celery's ``before_task_publish`` and ``after_task_publish`` signals are sent as Celery
sends them, so a receiver that stamps headers sees and changes every release.
"""

from __future__ import annotations

import base64
import random
import uuid
from collections.abc import Callable
from typing import Any

import orjson
from celery import signals
from kombu.entity import maybe_delivery_mode
from kombu.utils import json as kombu_json

__all__ = ["RedisPush"]

# Options Celery's send_task_message takes itself; the rest are message properties.
_CELERY_NAMED = frozenset(("exchange", "routing_key", "queue", "event_dispatcher", "retry",
                           "retry_policy", "serializer", "delivery_mode", "compression", "declare",
                           "headers", "exchange_type", "timeout", "confirm_timeout"))
# Properties kombu's publish takes as arguments rather than passing them on.
_KOMBU_NAMED = frozenset(("priority", "expiration", "mandatory", "immediate", "content_type",
                          "content_encoding"))
# Options whose handling by kombu this module does not repeat: such a message goes through it.
_KOMBU_ONLY = ("mandatory", "immediate", "content_type", "content_encoding", "compression")
# What orjson writes as kombu's JSON would. It writes a few types kombu's encoder tags (UUIDs,
# enums) as plain values: a publish signal's receiver may put anything in the headers, so
# they are checked for these when there is one; arguments and options are JSON already.
_PLAIN = (str, int, float, bool, type(None))
_ORJSON = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_SUBCLASS


def _delivery_tag() -> str:
    """A random version 4 UUID, as kombu tags a message, from the process's generator.

    ``uuid.uuid4`` reads the system's entropy source, and that call gives up the interpreter
    lock: the sender thread then waits for the engine thread to hand it back, once per
    message. The tag only needs to be unique among a channel's unacknowledged messages.
    """
    return str(uuid.UUID(int=random.getrandbits(128), version=4))


def _plain(value: Any) -> bool:
    """Whether *value* is made of JSON's own types only (text keys, no subclasses)."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind in _PLAIN:
            continue
        if kind is dict:
            if not all(type(key) is str for key in item):
                return False
            stack.extend(item.values())
        elif kind is list or kind is tuple:
            stack.extend(item)
        else:
            return False
    return True


def _refuse(value: Any) -> Any:
    raise TypeError(f"left to kombu's encoder: {type(value).__name__}")


def _kombu_json(value: Any) -> bytes:
    text: str = kombu_json.dumps(value)  # type: ignore[no-untyped-call]
    return text.encode("utf-8")


def _json(value: Any) -> bytes:
    """*value* as JSON, as kombu's encoder writes it (by orjson where that is the same)."""
    try:
        return orjson.dumps(value, default=_refuse, option=_ORJSON)
    except TypeError:
        return _kombu_json(value)


class RedisPush:
    """Builds released tasks' Redis documents and pushes a step's worth in one pipeline.

    Used from one thread (the publisher's). :meth:`add` takes a message or says it must go
    through kombu; :meth:`push` sends what was added, in order; :meth:`discard` drops it.
    """

    def __init__(self, app: Any, channel: Any) -> None:
        conf = app.conf
        self._channel = channel
        self._retry_policy: dict[str, Any] = dict(conf.task_publish_retry_policy or {})
        self._default_delivery_mode = conf.task_default_delivery_mode
        self._compressed = bool(conf.task_compression)
        self._pending: list[tuple[str, bytes]] = []
        self._published: list[Callable[[], None]] = []

    @classmethod
    def for_channel(cls, app: Any, channel: Any) -> RedisPush | None:
        """One for kombu's Redis *channel*; None for any other transport."""
        needed = ("_q_for_pri", "_get_message_priority", "conn_or_acquire", "_expires")
        if not all(hasattr(channel, name) for name in needed):
            return None
        if getattr(channel, "body_encoding", None) != "base64":
            return None
        return cls(app, channel)

    def _queue(self, message: Any, options: dict[str, Any]) -> Any:
        """The queue *options* send *message* to, if this module may push it there; else None."""
        if message[3] is not None or signals.task_sent.receivers or self._compressed:
            return None  # a task-sent event, or the deprecated signal, goes with kombu's send
        if options.get("declare") is None or any(options.get(name) for name in _KOMBU_ONLY):
            return None  # the route's first message declares its queue through kombu
        queue = options.get("queue")
        if queue is None or isinstance(queue, str):
            return None
        exchange_type = options.get("exchange_type") or queue.exchange.type
        if exchange_type != "direct" or (options.get("exchange") and options.get("routing_key")):
            return None  # not sent to the queue itself: kombu looks its bindings up
        expires = self._channel._expires
        if expires and queue.name in expires:
            return None
        return queue

    def add(self, name: str, message: Any, options: dict[str, Any]) -> bool:
        """Queue the document of Celery's *message* (routed *options*); False if kombu must send it."""
        queue = self._queue(message, options)
        if queue is None:
            return False
        headers, properties, body, _ = message
        body_json = _json(body)
        if options.get("headers"):
            headers.update(options["headers"])
        properties.update((key, value) for key, value in options.items() if key not in _CELERY_NAMED)
        routing_key = queue.name
        stamped = bool(signals.before_task_publish.receivers)
        if stamped:
            signals.before_task_publish.send(
                sender=name, body=body, exchange="", routing_key=routing_key,
                declare=options["declare"], headers=headers, properties=properties,
                retry_policy=dict(self._retry_policy, **(options.get("retry_policy") or {})))
        sent = {key: value for key, value in properties.items() if key not in _KOMBU_NAMED}
        sent["delivery_mode"] = maybe_delivery_mode(  # type: ignore[no-untyped-call]
            options.get("delivery_mode") or queue.exchange.delivery_mode or self._default_delivery_mode)
        expiration = options.get("expiration")
        if expiration is not None:
            sent["expiration"] = str(int(expiration * 1000))
        sent.setdefault("priority", options.get("priority") or 0)
        sent["delivery_info"] = dict(sent.get("delivery_info") or {}, exchange="",
                                     routing_key=routing_key)
        sent["body_encoding"] = "base64"
        sent["delivery_tag"] = _delivery_tag()
        document = {
            "body": base64.b64encode(body_json).decode("ascii"),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": headers,
            "properties": sent,
        }
        channel = self._channel
        key = channel._q_for_pri(routing_key, channel._get_message_priority(document, reverse=False))
        if stamped and not (_plain(headers) and _plain(sent)):
            self._pending.append((key, _kombu_json(document)))
        else:
            self._pending.append((key, _json(document)))
        if signals.after_task_publish.receivers:
            self._published.append(lambda: signals.after_task_publish.send(
                sender=name, body=body, headers=headers, exchange="", routing_key=routing_key))
        return True

    def push(self) -> None:
        """Push every document added, in order, in one pipeline; raises if it failed.

        A pipeline that failed may have been taken in part: the caller counts all of them as
        uncertain, as for kombu's publish batches.
        """
        pending, self._pending = self._pending, []
        published, self._published = self._published, []
        if not pending:
            return
        with self._channel.conn_or_acquire() as client:
            pipe = client.pipeline(transaction=False)
            try:
                for key, document in pending:
                    pipe.lpush(key, document)
                pipe.execute()
            finally:
                pipe.reset()
        for signal in published:
            signal()

    def discard(self) -> None:
        self._pending, self._published = [], []
