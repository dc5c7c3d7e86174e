"""The worker's producer of outcomes and beats to ``<topic>.outcomes``.

A worker process reports each attempt's outcome, and beats while a task runs
(:mod:`celery_scheduler.heartbeat`), through one :class:`OutcomeProducer`: it never blocks
the task, and it survives a broker that stops answering (it sends again what timed out, and
replaces a producer that stopped working).
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from celery_scheduler.config import Settings
from celery_scheduler.wire import Beat, Outcome, outcome_topic

__all__ = ["OutcomeProducer"]

# its lines are the worker hooks', as they were before this module was split from them
logger = logging.getLogger("celery_scheduler.worker")

# A worker's producer whose outcomes have all failed for this long (seconds) is replaced.
# Long chaos runs left some producers, after a Kafka restart, failing every record for many
# minutes while other processes wrote to the same broker; each of those outcomes cost its
# task a second run once its lease ended. During a real outage a new producer fails the
# same way, and making one costs little.
REPLACE_AFTER_SECONDS = 10.0
# A producer that has reported nothing for this long (seconds), neither a delivery nor a
# failure, while records wait for their reports, is stuck and replaced as well. After a
# Kafka restart, chaos runs left producers holding every outcome for a minute, until their
# delivery timeout, waiting for a partition leader they had not learnt of ("new leader not
# found in cache"): the dispatcher, hearing nothing, sent each of those tasks again.
STUCK_AFTER_SECONDS = 5.0
# At most this many undelivered outcomes are kept to send again (the oldest go first); a
# task whose outcome is lost runs again when its lease ends.
UNDELIVERED_KEPT = 10_000
# An outcome is sent at most this many times: once, and once more after it timed out. A
# send that a replaced producer purged does not count: Kafka never had the time to take it.
# (A Kafka controller stalled for 30 s in the cluster chaos run had the workers replace their
# stuck producers twice, 5 s apart, before any could get a producer id: counting the purges
# dropped 221 outcomes, and each of their tasks waited for its lease before its ordering id
# moved on.)
MAX_SENDS = 2
# How long a worker's producer gathers outcomes into one request (milliseconds; linger.ms in
# scheduler_kafka_options overrides it).
OUTCOME_LINGER_MS = 50
# How long the client keeps trying to deliver an outcome (ms), at least: longer than a
# broker restart usually takes; one that times out is sent once more after.
OUTCOME_DELIVERY_TIMEOUT_MS = 60_000


class OutcomeProducer:
    """Produces outcomes to the outcomes topic without waiting; one per worker process.

    The Kafka client batches and retries in its own thread (``acks=all``, idempotent), until
    a record's delivery timeout (a minute), which a broker restart can outlast. An
    outcome that timed out is sent once more: as soon as the producer delivers again, or by
    the producer that replaces it. A producer that reported a fatal error, or whose records
    have all failed for ``REPLACE_AFTER_SECONDS``, is replaced at the next outcome. An outcome
    that is never delivered costs its task a second run when its lease ends.
    """

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.monotonic) -> None:
        from celery_scheduler.tasklog.kafka import client_config

        config = client_config(settings.kafka_bootstrap_servers, settings.kafka_options)
        # A dispatcher waits for the outcome to release the next task of the ordering id, but
        # the broker's work goes by the batch of each partition a request carries, and a
        # worker's outcomes spread over every partition of the topic: gather some. In a
        # backlog drain (two solo workers, 12 partitions, 1,200-1,400 tasks/s), 20 ms left
        # about one outcome a batch; 60 ms took Kafka's CPU a task from 0.14-0.15 ms to
        # 0.08-0.11 and the drain rate up 6-8%, 100 ms no further. The next task of an
        # ordering id may wait up to 50 ms for the outcome of the one before, as long as the
        # dispatcher's fetch wait (50 ms).
        config.setdefault("linger.ms", OUTCOME_LINGER_MS)
        config.update({"acks": "all", "enable.idempotence": True,
                       "delivery.timeout.ms": max(OUTCOME_DELIVERY_TIMEOUT_MS,
                                                  int(settings.lease_seconds * 1000 / 2)),
                       "error_cb": self._on_error})
        self.topic = outcome_topic(settings.kafka_topic)
        self._config = config
        self._clock = clock
        self._lock = threading.Lock()
        self._generation = 0  # of the producer in use; failures of replaced ones do not count
        self._failing_since: float | None = None  # first failed report since the last success
        # Records of the producer in use not reported yet, and since when it has been
        # waiting for a report with some of them out (None: none out).
        self._unreported = 0
        self._waiting_since: float | None = None
        self._fatal: Any = None
        # Outcomes that failed, with how often they were sent: sent again once a producer
        # delivers (this one, or the one that replaces it).
        self._undelivered: collections.deque[tuple[tuple[bytes, bytes, int], int]] = \
            collections.deque(maxlen=UNDELIVERED_KEPT)
        self.replaced = 0
        self._producer = self._new_producer()

    def _new_producer(self) -> Any:
        from confluent_kafka import Producer

        return Producer(self._config)

    def send(self, outcome: Outcome) -> None:
        with self._lock:
            self._replace_if_broken()
            self._produce((outcome.encode(), outcome.key.ordering_id.encode("utf-8"),
                           outcome.partition), sends=1)
            self._producer.poll(0)  # serve the reports of earlier records
            self._send_again_if_delivering()

    def send_beat(self, beat: Beat, answered: Callable[[bool], None]) -> None:
        """Hand *beat* to the client; *answered* learns whether Kafka took it. A beat that
        failed is not sent again: the next one is due soon, and a late one would not count."""
        def delivered(error: Any, message: Any) -> None:
            self._reported(generation)
            answered(error is None)

        with self._lock:
            self._replace_if_broken()
            generation = self._generation
            try:
                self._producer.produce(self.topic, beat.encode(), key=beat.key.ordering_id.encode("utf-8"),
                                       partition=beat.partition, on_delivery=delivered)
            except BufferError:
                answered(False)
                return
            self._out()

    def poll(self) -> None:
        """Serve the client's delivery reports; replace the producer if it is stuck."""
        with self._lock:
            self._producer.poll(0)
            if self._stuck():
                self._replace_if_broken()

    def _out(self) -> None:
        """A record of the producer in use went out (the lock held)."""
        if self._unreported == 0:
            self._waiting_since = self._clock()
        self._unreported += 1

    def _reported(self, generation: int) -> None:
        """The client reported a record of producer *generation* (in poll: the lock held)."""
        if generation == self._generation and self._unreported > 0:
            self._unreported -= 1
            self._waiting_since = self._clock() if self._unreported else None

    def _stuck(self) -> bool:
        return (self._waiting_since is not None
                and self._clock() - self._waiting_since > STUCK_AFTER_SECONDS)

    def _send_again_if_delivering(self) -> None:
        """Send the outcomes that failed once more (the lock held), once a record was
        delivered after they failed: the broker answers again, as after a restart."""
        if self._undelivered and self._failing_since is None:
            again = list(self._undelivered)
            self._undelivered.clear()
            for record, sends in again:
                self._produce(record, sends + 1)

    def _produce(self, record: tuple[bytes, bytes, int], sends: int) -> None:
        value, key, partition = record
        on_delivery = functools.partial(self._delivered, self._generation, record, sends)
        try:
            self._producer.produce(self.topic, value, key=key, partition=partition,
                                   on_delivery=on_delivery)
        except BufferError:
            self._producer.poll(1.0)  # the client's queue is full: let it drain a moment
            self._producer.produce(self.topic, value, key=key, partition=partition,
                                   on_delivery=on_delivery)
        self._out()

    def flush(self, timeout: float) -> int:
        with self._lock:
            self._producer.poll(0)
            self._send_again_if_delivering()
            return int(self._producer.flush(timeout))

    def _on_error(self, error: Any) -> None:
        if error.fatal():
            self._fatal = error  # replaced at the next outcome

    def _delivered(self, generation: int, record: tuple[bytes, bytes, int], sends: int,
                   error: Any, message: Any) -> None:
        self._reported(generation)
        if error is None:
            if generation == self._generation:
                self._failing_since = None
            return
        from confluent_kafka import KafkaError

        if error.code() in (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT):
            self._undelivered.append((record, sends - 1))  # a send Kafka had no time for
        elif sends < MAX_SENDS:
            self._undelivered.append((record, sends))  # see _send_again_if_delivering
        else:
            logger.warning("an outcome did not reach Kafka (%s); its task runs again when its "
                           "lease ends", error)
        if generation == self._generation and self._failing_since is None:
            self._failing_since = self._clock()
            logger.warning("outcomes are not reaching Kafka (%s); the producer is replaced if "
                           "none is for %.0fs", error, REPLACE_AFTER_SECONDS)

    def _replace_if_broken(self) -> None:
        """Replace the producer (the lock held) if it is broken; the new one sends again what
        the old one did not deliver."""
        self._producer.poll(0)  # reports waiting to be served are not a stuck producer
        if self._fatal is not None:
            reason = f"fatal error: {self._fatal.str()}"
        elif (self._failing_since is not None
              and self._clock() - self._failing_since > REPLACE_AFTER_SECONDS):
            reason = f"no outcome acknowledged for {self._clock() - self._failing_since:.0f}s"
        elif self._stuck():
            reason = (f"{self._unreported} record(s) without a report for "
                      f"{self._clock() - (self._waiting_since or 0):.0f}s")
        else:
            return
        old, self._producer = self._producer, self._new_producer()
        self._generation += 1
        self._failing_since = self._fatal = self._waiting_since = None
        self._unreported = 0
        self.replaced += 1
        try:
            old.purge()
            old.poll(0)  # reports the records it held as failed
        except Exception:  # the old client may be in any state
            logger.debug("purging the replaced producer failed", exc_info=True)
        logger.warning("replaced the Kafka producer of outcomes (%s); sending the %d outcomes it "
                       "did not deliver again", reason, len(self._undelivered))
        self._send_again_if_delivering()
