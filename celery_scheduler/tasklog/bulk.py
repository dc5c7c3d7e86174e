"""Batches of records for the Kafka task log (``schedule_many``), on a producer of their own.

A schedule call's producer reports every delivery, for the call's handle: a Python call per
record, on the task log's poll thread, that a batch does not need. This producer reports
only failures (``delivery.report.only.error``) and lingers 5 ms to fill its requests. A
batch is acknowledged when the producer holds nothing more (``flush``): every record it
was given was acknowledged, or reported as failed to the batch it belongs to.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from celery_scheduler.errors import TaskLogUnavailableError
from celery_scheduler.tasklog.base import UNACKNOWLEDGED, BatchAck, Headers

__all__ = ["BulkProducer"]

# How long to wait for room when the producer's local queue is full, between tries.
FULL_WAIT = 0.01

# Let the producer's partitioner choose (librdkafka's RD_KAFKA_PARTITION_UA).
ANY_PARTITION = -1

Translate = Callable[[KafkaError, str], Exception]


class _Batch(BatchAck):
    """One batch; its records' delivery callback, which only their failures call."""

    def __init__(self, bulk: BulkProducer, count: int, translate: Translate) -> None:
        super().__init__(count)
        self._bulk = bulk
        self._translate = translate

    def __call__(self, error: KafkaError | None, message: Any) -> None:
        if error is None:  # not sent with delivery.report.only.error; taken as it is
            return
        key = (message.key() or b"").decode("utf-8", "replace")
        self._fail(key, message.value() or b"", self._translate(error, key))

    def done(self) -> bool:
        if not self._done.is_set() and self._bulk.idle():
            self._finish()
        return self._done.is_set()

    def _wait_done(self, timeout: float | None) -> bool:
        if not self._done.is_set():
            if self._bulk.drain(timeout):
                self._bulk.give_up()
            self._finish()  # drained, or purged: every record was answered either way
        return True


class BulkProducer:
    """Produces batches of records to *topic*; thread-safe, one batch at a time.

    *config* is the task log's producer settings. A batch whose wait times out purges what
    the producer still holds (those records are reported to their batches as not
    acknowledged) and replaces the producer, as the task log does with a stuck producer.
    """

    def __init__(self, config: dict[str, Any], topic: str, timeout: float,
                 translate: Translate, linger_ms: float = 5) -> None:
        self.topic = topic
        self.timeout = timeout
        self._config = {key: value for key, value in config.items() if key != "error_cb"}
        self._config.update({"linger.ms": linger_ms, "delivery.report.only.error": True})
        self._translate = translate
        self._producer = Producer(self._config)
        self._lock = threading.Lock()
        self.replaced = 0

    def publish(self, records: Collection[tuple[str, bytes]],
                headers: Headers | None = None) -> BatchAck:
        """Produce *records* (key, value) in order, with ``headers(key, value)`` if given;
        their acknowledgement.

        The records are taken one at a time as they are produced (they may be made as they
        are taken). A full local queue is waited for, up to the timeout without progress;
        then TaskLogUnavailableError says how many of the batch were produced (those may
        still be acknowledged: ``flush`` tells).
        """
        batch = _Batch(self, len(records), self._translate)
        topic = self.topic
        remaining = iter(records)
        record: tuple[str, bytes] | None = None  # taken, and not produced yet
        produced = 0
        stalled_after, stalled_since = -1, 0.0  # records produced when the queue was full
        replaced = False
        with self._lock:  # a batch's records go together, in order
            while True:
                produce = self._producer.produce
                try:
                    if record is not None:  # the one a full queue or a fatal error refused
                        self._produce(record, headers, batch)
                        produced += 1
                        record = None
                    if headers is None:
                        for record in remaining:
                            # by position, a third cheaper: value, key, any partition
                            produce(topic, record[1], record[0], ANY_PARTITION, batch)
                            produced += 1
                    else:
                        for record in remaining:
                            self._produce(record, headers, batch)
                            produced += 1
                    return batch
                except BufferError:  # local queue full: wait for deliveries to drain it
                    now = time.monotonic()
                    if produced != stalled_after:  # it was not full since the last produced
                        stalled_after, stalled_since = produced, now
                    elif now - stalled_since > self.timeout:
                        raise TaskLogUnavailableError(
                            f"Kafka producer queue stayed full for {self.timeout}s after "
                            f"{produced} of {len(records)} record(s) of a batch; the brokers "
                            "are not keeping up or not reachable. " + UNACKNOWLEDGED) from None
                    self._producer.poll(FULL_WAIT)
                    continue
                except KafkaException as exc:
                    error = exc.args[0]
                    if isinstance(error, KafkaError) and error.fatal() and not replaced:
                        self._replace()
                        replaced = True
                        continue
                    raise self._translate(error, record[0] if record else "") from exc

    def _produce(self, record: tuple[str, bytes], headers: Headers | None, batch: _Batch
                 ) -> None:
        key, value = record
        if headers is None:
            self._producer.produce(self.topic, value, key, ANY_PARTITION, batch)
        else:
            self._producer.produce(self.topic, key=key, value=value, on_delivery=batch,
                                   headers=list(headers(key, value).items()))

    def idle(self) -> bool:
        """Whether the producer holds no record (each was acknowledged or reported)."""
        self._producer.poll(0)  # serve failure reports
        return len(self._producer) == 0

    def drain(self, timeout: float | None = None) -> int:
        """Wait until every record is answered, up to *timeout*; how many are not yet."""
        with self._lock:
            producer = self._producer
        remaining: int = producer.flush(self.timeout if timeout is None else timeout)
        return remaining

    def give_up(self) -> None:
        """Purge what the producer holds, reported to its batches as not acknowledged, and
        replace the producer (one that stopped delivering may never start again)."""
        with self._lock:
            if len(self._producer):
                self._replace()

    def _replace(self) -> None:
        old, self._producer = self._producer, Producer(self._config)
        self.replaced += 1
        try:
            old.purge()  # reports each record it held as failed, to its batch
            old.poll(0)
        except KafkaException:
            pass

