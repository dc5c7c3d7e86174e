"""The Kafka side of a release: produce a delayed message (``schedule_message``) when it is due.

The engine marks a message released, as any task, and hands it here instead of to Celery.
It is produced by an idempotent producer with ``acks=all``; Kafka's acknowledgement is the
message's outcome, delivered to the engine like a worker's: success finishes the key and
frees its ordering id for the next message, a refusal (or no acknowledgement within
``DELIVERY_TIMEOUT_MS``) is a failed attempt, retried with the key's backoff. A dispatcher
that dies between Kafka's acknowledgement and recording it produces the message again when
the release's lease ends: at least once, never zero times.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaException, Producer

from celery_scheduler.clock import now_ms
from celery_scheduler.envelope import ScheduleEnvelope
from celery_scheduler.errors import EnvelopeDecodeError, ReleaseNotSentError
from celery_scheduler.messages import KEY_HEADER, DelayedMessage
from celery_scheduler.wire import Outcome, OutcomeBatch, Release

__all__ = ["DELIVERY_TIMEOUT_MS", "KafkaDelivery"]

logger = logging.getLogger(__name__)

# Longest a message waits for Kafka's acknowledgement (or for its topic to exist) before the
# attempt counts as failed.
DELIVERY_TIMEOUT_MS = 15_000


class KafkaDelivery:
    """Produces released messages and reports each one's acknowledgement to *report*."""

    def __init__(self, config: dict[str, Any], report: Callable[[OutcomeBatch], None],
                 timeout_ms: int = DELIVERY_TIMEOUT_MS) -> None:
        self._producer = Producer({
            **config, "acks": "all", "enable.idempotence": True, "linger.ms": 1,
            "message.timeout.ms": timeout_ms,
            # a topic that does not exist fails its messages this soon, not at the timeout
            "topic.metadata.propagation.max.ms": min(timeout_ms, 10_000),
        })
        self._report = report
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="celery-scheduler-delivery",
                                        daemon=True)
        self._thread.start()

    def deliver(self, items: list[tuple[ScheduleEnvelope, Release]]) -> list[Exception | None]:
        """Produce each message; None for each handed to Kafka, ReleaseNotSentError if not.

        A message the client refuses at once (too large, say) counts as a failed attempt,
        reported like a refusal by the broker.
        """
        results: list[Exception | None] = []
        refused: list[Outcome] = []
        for envelope, release in items:
            started, topic = now_ms(), "?"
            try:
                message = DelayedMessage.of(envelope)
                topic = message.topic
                self._producer.produce(
                    message.topic, message.value, key=message.key,
                    headers=[*message.headers, (KEY_HEADER, str(release.key).encode("utf-8"))],
                    on_delivery=self._acknowledged(release, started))
            except BufferError as exc:  # the client's queue is full: certainly not sent
                results.append(ReleaseNotSentError(f"the Kafka producer's queue is full: {exc}"))
                continue
            except (KafkaException, EnvelopeDecodeError, TypeError, ValueError) as exc:
                # a topic the client already knows is missing is refused here, not reported
                refused.append(_outcome(release, started,
                                        f"Kafka refused the message for topic {topic!r}: {exc}"))
            results.append(None)
        self._producer.poll(0)
        if refused:
            self._report(OutcomeBatch(refused, {}))
        return results

    def _acknowledged(self, release: Release, started: int) -> Callable[[Any, Any], None]:
        def acknowledged(error: Any, message: Any) -> None:
            failure = None
            if error is not None:
                topic = message.topic() if message is not None else "?"
                failure = f"Kafka did not take the message for topic {topic!r}: {error}"
                logger.warning("%s (%s, attempt %d)", failure, release.key, release.attempt)
            self._report(OutcomeBatch([_outcome(release, started, failure)], {}))
        return acknowledged

    def _serve(self) -> None:
        while not self._stopped.is_set():
            self._producer.poll(0.05)  # delivery reports call back from here

    def close(self, timeout: float = 10.0) -> None:
        left = self._producer.flush(timeout)
        if left:
            logger.warning("%d delayed message(s) were not acknowledged before shutdown; they "
                           "are produced again when their leases end", left)
        self._stopped.set()
        self._thread.join(timeout)


def _outcome(release: Release, started: int, error: str | None) -> Outcome:
    return Outcome(release.key, release.partition, release.attempt, error is None, error,
                   started, now_ms(), release.lease_until_ms)
