"""The Celery side of a release: publish due tasks to ordinary Celery workers, through one
producer kept between calls, and say of each whether it was sent (see :class:`Publisher`).
The message itself is built by :mod:`celery_scheduler.release.message`."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, overload

from celery_scheduler.clock import now_ms
from celery_scheduler.envelope import ScheduleEnvelope
from celery_scheduler.errors import ReleaseNotSentError, ReleaseUncertainError
from celery_scheduler.redis_clients import reuse_clients
from celery_scheduler.release.confirms import Confirms, Unconfirmed, refused, supports_confirms
from celery_scheduler.release.message import (
    SendContext,
    _release_options,
    _route,
    _templated,
    publish,
    task_message,
)
from celery_scheduler.release.redis_push import Document, RedisPush
from celery_scheduler.release.template import Templates, static_routes
from celery_scheduler.wire import Release

__all__ = ["CONFIRM_TIMEOUT_SECONDS", "Prepared", "Publisher", "publish_each"]

T = TypeVar("T")

# How long a step waits for RabbitMQ to confirm its releases; the unconfirmed ones are then
# uncertain (released again when their lease ends).
CONFIRM_TIMEOUT_SECONDS = 5.0


@dataclass(frozen=True)
class Prepared:
    """A release's message built ahead of its due time (:meth:`Publisher.prepare_many`)."""

    generation: int  # of the publisher's producer it was built for
    document: Document


def publish_each(publish: Callable[[T, Release], None], items: list[tuple[T, Release]]
                 ) -> list[Exception | None]:
    """Publish *items* one at a time: None for each sent, else why it was not (or may not be).

    The one that failed may have reached the broker (``ReleaseUncertainError``) unless it
    raised ``ReleaseNotSentError``; the rest are not tried, since the broker is down
    (``ReleaseNotSentError``).
    """
    results: list[Exception | None] = []
    for index, (item, release) in enumerate(items):
        try:
            publish(item, release)
        except Exception as exc:
            rest = len(items) - index - 1
            failed = exc if isinstance(exc, ReleaseNotSentError) else _uncertain(exc)
            return results + [failed] + [_not_sent(exc)] * rest
        results.append(None)
    return results


def _uncertain(exc: Exception) -> ReleaseUncertainError:
    error = ReleaseUncertainError(f"the broker connection failed while sending: {exc!r}")
    error.__cause__ = exc
    return error


def _not_sent(exc: Exception) -> ReleaseNotSentError:
    error = ReleaseNotSentError(f"no connection to the broker: {exc!r}")
    error.__cause__ = exc
    return error


class Publisher:
    """Publishes releases through one producer, kept between calls.

    On RabbitMQ (py-amqp) the producer has a connection and channel of its own, in confirm
    mode (see ``confirms``): a release counts as sent once RabbitMQ confirmed it. On other
    brokers it comes from the app's producer pool. Used from one thread (the release
    engine's, or its sender's when releases are marked ahead). After a failure the producer
    is let go and the next call takes a fresh one.
    """

    def __init__(self, app: Any, *, redis_push: bool = True) -> None:
        self.app = app
        self._redis_push = redis_push  # False: every release goes through kombu's producer
        self._producer: Any = None
        self._confirms: Confirms | None = None  # set while the producer is our RabbitMQ one
        self._connection: Any = None  # that producer's connection, ours to let go
        self._declared: set[tuple[Any, ...]] = set()  # routes declared on the producer's connection
        self._push: RedisPush | None = None  # set while the producer is on Redis
        # documents of releases pushed on the producer's connection, to build the next ones
        # from (None: the app has router functions, which may route on the arguments)
        self._templates: Templates | None = None
        self._batches: bool | None = None  # whether the producer takes publish batches, once known
        # Bumped whenever the producer is let go: a message prepared for an earlier one is
        # built again (its queue may have to be declared again on the new connection).
        self._generation = 0

    def publish(self, envelope: ScheduleEnvelope, release: Release) -> None:
        producer = self._in_use()
        if self._confirms is not None:
            (error,) = self._publish_confirmed(producer, [(envelope, release)])
            if isinstance(error, Exception):
                raise error
            return
        try:
            publish(self.app, envelope, release, producer=producer,
                    declared=self._declared)
        except Exception:
            self.close()
            raise

    def prepare_many(self, items: list[tuple[ScheduleEnvelope, Release]]) -> list[Prepared | None]:
        """Build *items*' messages now, to be sent at their due times by :meth:`publish_many`.

        A release is marked ahead of its due time and sent at it (``release_ahead_seconds``);
        building its message in between, with the others marked in the same step, leaves
        only the push to Redis (and Celery's publish signals, sent then as always) for its
        due time. None for a message built when it is sent: not on Redis, the first of its
        route on this connection (kombu declares the queue), or with arguments kombu's
        encoder must write.
        """
        push = self._push
        context = SendContext.of(self.app)
        if push is None or context.in_task:
            return [None] * len(items)
        prepared: list[Prepared | None] = []
        templates = self._templates
        for envelope, release in items:
            at = dt.datetime.fromtimestamp(max(now_ms(), release.not_before_ms) / 1000,
                                           dt.timezone.utc)
            if templates is not None and (made := _templated(templates, envelope, release, at)):
                prepared.append(Prepared(self._generation, made))
                continue
            args, kwargs, sent = _release_options(envelope, release, at)
            if (args is not envelope.args or kwargs is not envelope.kwargs
                    or _route(envelope.task, sent) not in self._declared):
                prepared.append(None)
                continue
            sent["declare"] = []
            message, options = task_message(self.app, envelope.task, envelope.task_id, args, kwargs,
                                            sent, at, context.sent_event)
            document = push.prepare(envelope.task, message, options)
            if document is not None and templates is not None:
                templates.learn(envelope.task, envelope.options, document)
            prepared.append(None if document is None else Prepared(self._generation, document))
        return prepared

    @overload
    def publish_many(self, items: list[tuple[ScheduleEnvelope, Release]],
                     prepared: Sequence[Prepared | None] | None = None, *,
                     confirm_later: Literal[False] = False) -> list[Exception | None]: ...

    @overload
    def publish_many(self, items: list[tuple[ScheduleEnvelope, Release]],
                     prepared: Sequence[Prepared | None] | None = None, *,
                     confirm_later: bool) -> list[Exception | Unconfirmed | None]: ...

    def publish_many(self, items: list[tuple[ScheduleEnvelope, Release]],
                     prepared: Sequence[Prepared | None] | None = None, *,
                     confirm_later: bool = False) -> list[Any]:
        """Publish *items* in order, in one round trip where the broker allows it.

        Each result is None (sent), ``ReleaseNotSentError`` (certainly not sent: there was
        no connection, or RabbitMQ refused it) or ``ReleaseUncertainError`` (the connection
        failed while sending or before RabbitMQ confirmed, so the broker may have taken it).
        With kombu's publish batches (Redis), the messages are sent together when the batch
        ends, instead of one round trip each; a batch that fails is uncertain as a whole,
        since kombu cannot say which of them Redis took. On RabbitMQ they are sent one after
        the other and confirmed together. Other brokers (or a Redis transport set to retry
        commands, which kombu does not batch) get them one at a time. *prepared* (from
        :meth:`prepare_many`, one per item) saves building the messages again.

        With *confirm_later*, a message published on RabbitMQ is not waited for: its result
        is an :class:`Unconfirmed`, settled by a later :meth:`collect_confirms` (or by
        :meth:`close`, as uncertain).
        """
        try:
            producer = self._connected()
        except Exception as exc:
            self.close()
            return [_not_sent(exc)] * len(items)
        if self._confirms is not None:
            return self._publish_confirmed(producer, items, confirm_later)
        if self._batches is None:  # kombu works it out from the connection's settings each time
            self._batches = bool(getattr(producer, "supports_batch_publish", False))
        if not self._batches:
            return publish_each(self.publish, items)
        push = self._push
        ready = [p if p is not None and p.generation == self._generation else None
                 for p in prepared or [None] * len(items)]
        try:
            if push is not None and all(p is not None for p in ready):
                for document in ready:
                    push.add_prepared(document.document)  # type: ignore[union-attr]
            else:
                # never flushed half-way: the batch is sent whole or counts as not sent
                context = SendContext.of(self.app)
                with producer.batch(max_size=1 << 30):
                    for (envelope, release), document in zip(items, ready, strict=True):
                        if push is not None and document is not None:
                            push.add_prepared(document.document)
                        else:
                            publish(self.app, envelope, release, producer=producer,
                                    declared=self._declared, push=push, context=context,
                                    templates=self._templates)
            if push is not None:
                push.push()  # what kombu did not send, in one pipeline
        except Exception as exc:
            if push is not None:
                push.discard()
            self.close()
            return [_uncertain(exc)] * len(items)
        return [None] * len(items)

    def _publish_confirmed(self, producer: Any, items: list[tuple[ScheduleEnvelope, Release]],
                           later: bool = False) -> list[Exception | Unconfirmed | None]:
        """Publish *items* without waiting, then wait once for RabbitMQ's confirms of all
        (unless *later*: then each is returned unconfirmed)."""
        confirms = self._confirms
        assert confirms is not None
        tags: list[int] = []
        context = SendContext.of(self.app)
        for envelope, release in items:
            try:
                # never kombu's retry: it reconnects and revives the producer on a channel
                # of its own, not in confirm mode, so the message's confirm would never come
                publish(self.app, envelope, release, producer=producer,
                        declared=self._declared, context=context, retry=False)
            except Exception as exc:
                self.close()
                rest = len(items) - len(tags) - 1
                return [_uncertain(exc)] * (len(tags) + 1) + [_not_sent(exc)] * rest
            tags.append(confirms.published())
        if later:
            return [confirms.later(tag) for tag in tags]
        try:
            taken = confirms.wait(tags, CONFIRM_TIMEOUT_SECONDS)
        except Exception as exc:
            self.close()
            return [_uncertain(exc)] * len(items)
        return [None if taken[tag] else refused() for tag in tags]

    @property
    def unconfirmed(self) -> int:
        """How many messages published with *confirm_later* RabbitMQ has not answered yet."""
        return 0 if self._confirms is None else self._confirms.unsettled

    def collect_confirms(self, timeout: float) -> None:
        """Settle what RabbitMQ confirmed of the messages published with *confirm_later*,
        waiting up to *timeout* seconds for its next answer.

        Those waiting longer than ``CONFIRM_TIMEOUT_SECONDS``, and all of them if the
        connection failed, are settled uncertain, and the producer is let go.
        """
        confirms = self._confirms
        if confirms is None or not confirms.unsettled:
            return
        try:
            confirms.drain(timeout)
        except Exception as exc:
            self._abandon(_uncertain(exc))
            return
        oldest = confirms.oldest()
        if oldest is not None and time.monotonic() - oldest > CONFIRM_TIMEOUT_SECONDS:
            self._abandon(ReleaseUncertainError(
                f"RabbitMQ did not confirm a release within {CONFIRM_TIMEOUT_SECONDS:g}s"))

    def _abandon(self, error: Exception) -> None:
        assert self._confirms is not None
        self._confirms.abandon(error)
        self.close()

    def _connected(self) -> Any:
        """The producer in use; a new one's connection is proven by a round trip first.

        After a failure the next producer may not reach the broker either: finding that out
        before sending anything makes those releases certainly unsent (sent again a second
        later) rather than uncertain (waiting for their lease).
        """
        fresh = self._producer is None
        producer = self._in_use()
        if fresh and self._confirms is None:
            client = getattr(producer.channel, "client", None)  # Redis: a PING
            if client is not None and hasattr(client, "ping"):
                client.ping()
            else:
                producer.connection.ensure_connection(max_retries=1)
        return producer

    def close(self) -> None:
        # a new connection may reach a broker that lost non-durable queues: declare again
        self._declared = set()
        self._generation += 1
        if self._push is not None:
            self._push.close()
        self._push = None
        self._templates = None
        self._batches = None
        producer, self._producer = self._producer, None
        confirms, self._confirms = self._confirms, None
        connection, self._connection = self._connection, None
        if producer is None:
            return
        if confirms is None:
            producer.release()
            return
        confirms.abandon(ReleaseUncertainError(
            "the connection to RabbitMQ was let go before it confirmed the release"))
        # our own RabbitMQ connection: its socket is closed without AMQP's close handshake,
        # which would wait for ever on a broker that stopped answering. The connection
        # opened, not the producer's: kombu drops that one when a publish fails to reconnect.
        connection.collect()

    def _in_use(self) -> Any:
        if self._producer is None:
            connection = self.app.connection_for_write()
            if connection.transport.driver_type == "amqp":
                try:
                    connection.ensure_connection(max_retries=1)  # Confirm.Select is a round trip
                    channel = connection.channel()
                    if supports_confirms(channel):
                        self._confirms = Confirms(channel)
                        self._connection = connection
                        self._producer = connection.Producer(channel)
                        return self._producer
                except Exception:
                    connection.collect()
                    raise
            connection.release()
            self._producer = self.app.producer_pool.acquire(block=True)
            reuse_clients(self._producer.channel)
            if self._redis_push:
                self._push = RedisPush.for_channel(self.app, self._producer.channel)
                if self._push is not None and static_routes(self.app):
                    self._templates = Templates()
        return self._producer
