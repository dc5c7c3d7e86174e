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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
import redis
from celery import signals
from kombu.entity import maybe_delivery_mode
from kombu.utils import json as kombu_json

__all__ = ["Document", "RedisPush", "encoded_body"]

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
_PLAIN = frozenset((str, int, float, bool, type(None)))
_ORJSON = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_SUBCLASS


# The version (4) and variant (RFC 4122) bits of a random UUID, as uuid.UUID(version=4) sets them.
_UUID4_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))
_UUID4_SET = (0x4000 << 64) | (0x8000 << 48)


def _delivery_tag() -> str:
    """A random version 4 UUID, as kombu tags a message, from the process's generator.

    ``uuid.uuid4`` reads the system's entropy source, and that call gives up the interpreter
    lock: the sender thread then waits for the engine thread to hand it back, once per
    message. The tag only needs to be unique among a channel's unacknowledged messages.
    """
    text = f"{random.getrandbits(128) & _UUID4_CLEAR | _UUID4_SET:032x}"
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def _plain(value: Any) -> bool:
    """Whether *value* is made of JSON's own types only (text keys, no subclasses).

    Run on every message's headers and properties when a publish signal has a receiver:
    a loop over each container's items, testing exact types and descending only into
    containers, took a third of the time of a stack of every value."""
    kind = type(value)
    if kind in _PLAIN:
        return True
    try:
        if kind is dict:
            for key, item in value.items():
                if type(key) is not str or (type(item) not in _PLAIN and not _plain(item)):
                    return False
            return True
        if kind is list or kind is tuple:
            for item in value:  # noqa: SIM110 - a loop: all() over a generator is slower
                if type(item) not in _PLAIN and not _plain(item):
                    return False
            return True
    except RecursionError:  # nested deeper than the interpreter's limit: kombu's encoder says
        return False
    return False


def _refuse(value: Any) -> Any:
    raise TypeError(f"left to kombu's encoder: {type(value).__name__}")


def _kombu_json(value: Any) -> bytes:
    text: str = kombu_json.dumps(value)
    return text.encode("utf-8")


def _json(value: Any) -> bytes:
    """*value* as JSON, as kombu's encoder writes it (by orjson where that is the same)."""
    try:
        return orjson.dumps(value, default=_refuse, option=_ORJSON)
    except TypeError:
        return _kombu_json(value)


def encoded_body(body: Any) -> str:
    """A message body as kombu's Redis transport stores it: JSON, then base64."""
    return base64.b64encode(_json(body)).decode("ascii")


@dataclass(frozen=True)
class Document:
    """A release's message as :meth:`RedisPush.prepare` left it: routed, its body encoded."""

    name: str
    headers: dict[str, Any]
    properties: dict[str, Any]
    body: Any
    body_base64: str
    routing_key: str
    options: dict[str, Any]
    delivery_mode: int


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
        self._published: list[Callable[[], object]] = []
        self._held: tuple[Any, Any] | None = None  # the pool and connection pushes go on

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
        document = self.prepare(name, message, options)
        if document is None:
            return False
        self.add_prepared(document)
        return True

    def prepare(self, name: str, message: Any, options: dict[str, Any]) -> Document | None:
        """What :meth:`add_prepared` needs of *message*, built now; None if kombu must send it.

        The body is encoded here; the publish signals, the delivery tag and the document
        itself wait for :meth:`add_prepared`, as Celery's publish sends the signals just
        before it writes the message.
        """
        queue = self._queue(message, options)
        if queue is None:
            return None
        headers, properties, body, _ = message
        if options.get("headers"):
            headers.update(options["headers"])
        properties.update((key, value) for key, value in options.items() if key not in _CELERY_NAMED)
        delivery_mode: int = maybe_delivery_mode(  # type: ignore[assignment]  # never None: a default is given
            options.get("delivery_mode") or queue.exchange.delivery_mode or self._default_delivery_mode)
        return Document(name, headers, properties, body, encoded_body(body), queue.name, options,
                        delivery_mode)

    def add_prepared(self, document: Document) -> None:
        """Queue *document* (from :meth:`prepare` on this channel) for the next :meth:`push`."""
        name, headers, properties = document.name, document.headers, document.properties
        options, routing_key = document.options, document.routing_key
        stamped = bool(signals.before_task_publish.receivers)
        if stamped:
            signals.before_task_publish.send(
                sender=name, body=document.body, exchange="", routing_key=routing_key,
                declare=options["declare"], headers=headers, properties=properties,
                retry_policy=dict(self._retry_policy, **(options.get("retry_policy") or {})))
        sent = {key: value for key, value in properties.items() if key not in _KOMBU_NAMED}
        sent["delivery_mode"] = document.delivery_mode
        expiration = options.get("expiration")
        if expiration is not None:
            sent["expiration"] = str(int(expiration * 1000))
        sent.setdefault("priority", options.get("priority") or 0)
        sent["delivery_info"] = dict(sent.get("delivery_info") or {}, exchange="",
                                     routing_key=routing_key)
        sent["body_encoding"] = "base64"
        sent["delivery_tag"] = _delivery_tag()
        encoded = {
            "body": document.body_base64,
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": headers,
            "properties": sent,
        }
        channel = self._channel
        key = channel._q_for_pri(routing_key, channel._get_message_priority(encoded, reverse=False))
        if stamped and not (_plain(headers) and _plain(sent)):
            self._pending.append((key, _kombu_json(encoded)))
        else:
            self._pending.append((key, _json(encoded)))
        if signals.after_task_publish.receivers:
            body = document.body
            self._published.append(lambda: signals.after_task_publish.send(
                sender=name, body=body, headers=headers, exchange="", routing_key=routing_key))

    def push(self) -> None:
        """Push every document added, in order, in one pipeline; raises if it failed.

        A pipeline that failed may have been taken in part: the caller counts all of them as
        uncertain, as for kombu's publish batches.
        """
        pending, self._pending = self._pending, []
        published, self._published = self._published, []
        if not pending:
            return
        # The commands go on a connection of the channel's pool, kept between pushes, as a
        # pipeline sends them (written together, then each reply read), without the
        # pipeline's and the pool's layers: they took as much CPU as building the message,
        # at light load where each push carries one. The documents bound for one list in a
        # row go in one LPUSH, which pushes its values in the order given, as one LPUSH
        # each would: in a backlog, one command and one reply for a whole step.
        connection = self._connection()
        try:
            commands = _lpushes(pending)
            connection.send_packed_command(connection.pack_commands(commands))
            for _ in commands:
                connection.read_response()
        except BaseException:
            self.close()  # replies may be left unread on it
            raise
        for signal in published:
            signal()

    def discard(self) -> None:
        self._pending, self._published = [], []

    def close(self) -> None:
        """Give the connection back to the channel's pool, closed (the next push takes another)."""
        held, self._held = self._held, None
        if held is not None:
            pool, connection = held
            connection.disconnect()
            pool.release(connection)

    def _connection(self) -> Any:
        """The connection pushes go on: the one kept, unless Redis closed it meanwhile."""
        if self._held is None:
            with self._channel.conn_or_acquire() as client:
                pool = client.connection_pool
                self._held = (pool, pool.get_connection())
            return self._held[1]
        connection = self._held[1]
        try:
            stale = connection.can_read()  # what the pool checks before it lends a connection
        except (OSError, redis.ConnectionError):
            stale = True
        if stale:
            connection.disconnect()
            connection.connect()
        return connection


def _lpushes(pending: list[tuple[str, bytes]]) -> list[list[Any]]:
    """One LPUSH for each run of *pending* documents bound for the same list, in order."""
    commands: list[list[Any]] = []
    for key, document in pending:
        if commands and commands[-1][1] == key:
            commands[-1].append(document)
        else:
            commands.append(["LPUSH", key, document])
    return commands
