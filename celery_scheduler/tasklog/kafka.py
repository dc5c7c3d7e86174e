"""The task log on Apache Kafka, through confluent-kafka.

Records are produced with Kafka's Java partitioner (``murmur2_random``), ``acks=all`` and
idempotence on, so that producers in any language agree on an ordering id's partition and
an acknowledged record is on every in-sync replica. librdkafka and confluent-kafka
exceptions are translated into :mod:`celery_scheduler.errors`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from celery_scheduler.errors import (
    EnvelopeTooLargeError,
    TaskLogError,
    TaskLogUnavailableError,
    TopicMissingError,
)
from celery_scheduler.tasklog.base import (
    UNACKNOWLEDGED,
    Ack,
    BatchAck,
    Headers,
    Position,
    TaskLog,
)
from celery_scheduler.tasklog.bulk import ANY_PARTITION, BulkProducer
from celery_scheduler.tasklog.kafka_log import KAFKA_LOG

__all__ = ["KafkaTaskLog", "create_topic", "topic_partitions"]

logger = logging.getLogger(__name__)

# How long the background thread blocks in each poll for delivery reports.
POLL_INTERVAL = 0.05
# Seconds past the delivery timeout (at least) before a record without a report is taken to
# mean its producer is stuck.
STUCK_GRACE = 10.0
# How long a batch's producer waits to fill a request, unless the options set linger.ms.
BULK_LINGER_MS = 5
# The longest a client waits between two attempts to reach a broker that is away. librdkafka's
# own default is 10 s (Java clients use 1 s): after a broker restart it kept a dispatcher out
# of its group, and a worker's outcomes unsent, for up to 10 s after the broker was back.
RECONNECT_BACKOFF_MAX_MS = 1000
# A broker that stalls (SIGSTOP, a long GC pause, a hung disk) keeps its connections open,
# so clients wait on it until a request times out: librdkafka's socket.timeout.ms is 60 s,
# and it learns of a new leader only from a failed request or its metadata refresh, every
# 5 minutes by default. Through a 30 s stall of one of three brokers, the partitions it led
# took neither produce nor fetch for the whole 30 s, although the controller fences a
# silent broker and moves its leadership after about 9 s (broker.session.timeout.ms). With
# a request given up after SOCKET_TIMEOUT_MS, just past that fencing, and the leaders asked
# for every METADATA_REFRESH_MS, produce and fetch went on 8-10 s into the stall. Both are
# overridden by the same keys in ``scheduler_kafka_options``.
SOCKET_TIMEOUT_MS = 10_000
METADATA_REFRESH_MS = 3000


def client_config(bootstrap_servers: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The librdkafka settings every client of ours shares (security options included).

    With ``logger`` set, librdkafka's messages go to Python logging instead of stderr (through
    :data:`~celery_scheduler.tasklog.kafka_log.KAFKA_LOG`: a connection outage shown once), but
    confluent-kafka hands them over only when the client is polled: a client that is not
    polled otherwise (an admin client, a producer used for metadata) must call
    :func:`forward_logs` after its requests.
    """
    return {"bootstrap.servers": bootstrap_servers, "logger": KAFKA_LOG,
            "reconnect.backoff.max.ms": RECONNECT_BACKOFF_MAX_MS,
            "socket.timeout.ms": SOCKET_TIMEOUT_MS,
            "topic.metadata.refresh.interval.ms": METADATA_REFRESH_MS, **options}


def forward_logs(client: AdminClient | Producer) -> None:
    """Hand the log lines librdkafka queued for *client* to Python logging now."""
    client.poll(0)


def _missing_topic(topic: str) -> TopicMissingError:
    return TopicMissingError(
        f"Kafka topic {topic!r} does not exist; create it (and the Cassandra schema) with "
        "`celery -A <your app> scheduler init`"
    )


def topic_partitions(admin: AdminClient | Producer, topic: str, timeout: float) -> int:
    """Return the partition count of *topic*, or raise TopicMissingError/TaskLogUnavailableError."""
    try:
        metadata = admin.list_topics(topic, timeout=timeout)
    except KafkaException as exc:
        forward_logs(admin)  # why it failed ("Connection refused", ...), logged
        raise TaskLogUnavailableError(
            f"Kafka did not answer a metadata request within {timeout}s ({exc.args[0]}); "
            "check scheduler_kafka_bootstrap_servers and that the brokers are up"
        ) from exc
    described = metadata.topics.get(topic)
    if described is None or described.error is not None:
        if described is not None and described.error is not None and described.error.code() not in (
            KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC,
        ):
            raise TaskLogError(f"Kafka reports an error for topic {topic!r}: {described.error}")
        raise _missing_topic(topic)
    return len(described.partitions)


def create_topic(bootstrap_servers: str, options: Mapping[str, Any], topic: str,
                 partitions: int, replication_factor: int, timeout: float = 30.0) -> bool:
    """Create *topic* if it does not exist; return True if it was created."""
    admin = AdminClient(client_config(bootstrap_servers, options))
    try:
        topic_partitions(admin, topic, timeout)
        return False
    except TopicMissingError:
        pass
    new = NewTopic(topic, num_partitions=partitions, replication_factor=replication_factor,
                   config={"min.insync.replicas": str(min(2, replication_factor))})
    try:
        admin.create_topics([new], operation_timeout=timeout)[topic].result(timeout)
    except KafkaException as exc:
        forward_logs(admin)
        error = exc.args[0]
        if isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return False
        raise TaskLogError(f"could not create Kafka topic {topic!r}: {error}") from exc
    # The controller has created it, but the other brokers learn of it a moment later; a
    # client asking one of them right away would be told the topic does not exist.
    deadline = time.monotonic() + timeout
    while True:
        try:
            topic_partitions(admin, topic, timeout)
            return True
        except TopicMissingError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class _Delivery(Ack):
    """The acknowledgement of one produced record, and the callback its delivery report calls.

    Being the callback itself (rather than a ``functools.partial`` of the log's method and a
    record number) saves an object and a lookup on every record of a batched schedule call.
    """

    __slots__ = ("_log", "key")

    def __init__(self, log: KafkaTaskLog, key: str) -> None:
        super().__init__()
        self._log = log
        self.key = key

    def __call__(self, error: KafkaError | None, message: Any) -> None:
        self._log._report(self, error, message)


class KafkaTaskLog(TaskLog):
    """Produces envelopes to one Kafka topic; thread-safe.

    A background thread serves delivery reports, so ``publish_async`` never blocks for
    long and ``publish`` waits only for its own record.

    The same thread replaces a producer that has stopped working: one that reported a fatal
    error, one holding a record that got no delivery report long after the delivery
    timeout, or one that got no record acknowledged for that long while its records failed
    (a long chaos run left such a producer, after repeated Kafka restarts, never
    reconnecting, so that every later schedule call of the process failed while other
    processes wrote to the same broker). The records it held are reported as not acknowledged (they may or may
    not have been written: scheduling the same key again is safe), and later calls go
    through a new producer.
    """

    def __init__(self, bootstrap_servers: str, topic: str, *, timeout: float = 10.0,
                 max_message_bytes: int = 1_000_000, options: Mapping[str, Any] | None = None
                 ) -> None:
        self.topic = topic
        self.timeout = timeout
        config = client_config(bootstrap_servers, options or {})
        # Send at once: a synchronous call waits for its own record, so any linger is added to
        # every call's latency (5 ms, librdkafka's default, capped one thread at ~150 calls/s),
        # while records produced during a send are batched for the next one anyway.
        config.setdefault("linger.ms", 0)
        config.update({
            "partitioner": "murmur2_random",  # Kafka's Java partitioner for non-null keys
            "acks": "all",
            "enable.idempotence": True,
            # give up on a record at about the time a caller stops waiting for it
            "delivery.timeout.ms": max(1000, int(timeout * 1000)),
            "message.max.bytes": max(max_message_bytes + 4096, 1_000_000),
            "error_cb": self._on_error,
        })
        self._config = config
        # batches' producer, made on the first batch; lingers to fill requests unless told
        self._bulk: BulkProducer | None = None
        self._bulk_linger = (options or {}).get("linger.ms", BULK_LINGER_MS)
        # a record without a report this long after it was produced means a stuck producer
        self._stuck_after = max(1.0, timeout) + max(STUCK_GRACE, timeout)
        try:
            self._producer = Producer(config)
        except KafkaException as exc:
            raise TaskLogError(f"invalid Kafka producer settings: {exc.args[0]}") from exc
        # Taken to produce and to replace the producer. A delivery report does not take it: the
        # report's thread pops its record from _pending (one dict operation, atomic), so that
        # records and their reports, 30,000 a second, do not contend for it.
        self._lock = threading.Lock()
        # each record produced and not yet reported, with when it counts as stuck; oldest first
        self._pending: dict[_Delivery, float] = {}
        self._fatal: KafkaError | None = None
        self._failing_since: float | None = None  # first failed report since the last success
        self.replaced = 0  # producers replaced so far
        self._partitions: int | None = None
        self._closed = threading.Event()
        self._checked = threading.Lock()
        self._poller = threading.Thread(target=self._poll_forever, name="celery-scheduler-kafka",
                                        daemon=True)
        self._poller.start()

    def _poll_forever(self) -> None:
        next_check = 0.0
        while not self._closed.is_set():
            self._producer.poll(POLL_INTERVAL)
            now = time.monotonic()
            if now >= next_check:
                next_check = now + 1.0
                self._check(now)

    def _on_error(self, error: KafkaError) -> None:
        if error.fatal():
            self._fatal = error  # the poll thread replaces the producer at its next check

    def _check(self, now: float) -> None:
        """Replace the producer if it reported a fatal error or holds a long-overdue record."""
        fatal, self._fatal = self._fatal, None
        if fatal is not None:
            self._replace(f"fatal error: {fatal.str()}")
            return
        try:
            oldest = next(iter(self._pending.values()), None)
        except RuntimeError:  # a report popped a record meanwhile: look again next time
            oldest = None
        if oldest is not None and now > oldest:
            self._replace(f"no delivery report for {self._stuck_after:.0f}s")
            return
        failing = self._failing_since
        if failing is not None and now - failing > self._stuck_after:
            # A broker outage is as long, and a new producer then fails the same way until
            # it ends: replacing it costs little, and cures a producer that never reconnects.
            self._replace(f"no record acknowledged for {now - failing:.0f}s")

    def _replace(self, reason: str) -> None:
        with self._lock:
            old, self._producer = self._producer, Producer(self._config)
            held, self._pending = self._pending, {}
            self.replaced += 1
            self._failing_since = None
        # a record is the report's or this one's: whichever pops it first
        failed = [delivery for delivery in list(held) if held.pop(delivery, None) is not None]
        logger.warning("replaced the Kafka producer (%s); %d record(s) it held are reported as "
                       "not acknowledged", reason, len(failed))
        for delivery in failed:
            delivery.settle(None, TaskLogUnavailableError(
                f"Kafka did not acknowledge the record for {delivery.key!r}: its producer was "
                f"replaced ({reason}); " + UNACKNOWLEDGED))
        try:
            old.purge()  # drop what it still holds; their reports find nobody waiting
            old.poll(0)
        except KafkaException:
            pass

    def _report(self, delivery: _Delivery, error: KafkaError | None, message: Any) -> None:
        if self._pending.pop(delivery, None) is None:  # failed already: its producer was replaced
            return
        if error is None:
            self._failing_since = None
            delivery.settle(Position(message.partition(), message.offset()))
            return
        failure = self._translate(error, delivery.key)
        if isinstance(failure, TaskLogUnavailableError) and self._failing_since is None:
            self._failing_since = time.monotonic()
        delivery.settle(None, failure)

    def partitions(self) -> int:
        if self._partitions is None:
            with self._checked:
                if self._partitions is None:
                    self._partitions = topic_partitions(self._producer, self.topic, self.timeout)
        return self._partitions

    def publish_async(self, key: str, value: bytes, headers: dict[str, bytes] | None = None
                      ) -> Ack:
        if self._closed.is_set():
            raise TaskLogError("the Kafka task log is closed")
        if self._partitions is None:
            self.partitions()  # fails fast, with a clear message, when the topic is missing
        encoded = key.encode("utf-8")
        listed: list[tuple[str, str | bytes | None]] | None = (
            list(headers.items()) if headers else None)
        delivery = _Delivery(self, key)
        deadline: float | None = None
        replaced = False
        while True:
            try:
                with self._lock:
                    # listed before it is produced: its report may come at once, on the
                    # poll thread
                    pending = self._pending
                    pending[delivery] = time.monotonic() + self._stuck_after
                    try:
                        if listed is None:  # by position, a third cheaper
                            self._producer.produce(self.topic, value, encoded, ANY_PARTITION,
                                                   delivery)
                        else:
                            self._producer.produce(self.topic, key=encoded, value=value,
                                                   headers=listed, on_delivery=delivery)
                    except BaseException:
                        del pending[delivery]
                        raise
                return delivery
            except BufferError:  # local queue full: wait for deliveries to drain it
                now = time.monotonic()
                deadline = now + self.timeout if deadline is None else deadline
                if now > deadline:
                    raise TaskLogUnavailableError(
                        f"Kafka producer queue stayed full for {self.timeout}s; "
                        "the brokers are not keeping up or not reachable"
                    ) from None
                time.sleep(POLL_INTERVAL)
            except KafkaException as exc:
                error = exc.args[0]
                if isinstance(error, KafkaError) and error.fatal() and not replaced:
                    self._replace(f"fatal error: {error.str()}")  # then try the new one once
                    replaced = True
                    continue
                raise self._translate(error, key) from exc

    def publish_many(self, records: Collection[tuple[str, bytes]],
                     headers: Headers | None = None) -> BatchAck:
        """Produce each (key, value) record in order, with ``headers(key, value)`` if given;
        one acknowledgement for all.

        Batches go through a producer of their own that reports only failures (see
        :mod:`celery_scheduler.tasklog.bulk`).
        """
        if self._closed.is_set():
            raise TaskLogError("the Kafka task log is closed")
        if self._partitions is None:
            self.partitions()  # fails fast, with a clear message, when the topic is missing
        bulk = self._bulk
        if bulk is None:
            with self._checked:
                if self._bulk is None:
                    try:
                        self._bulk = BulkProducer(self._config, self.topic, self.timeout,
                                                  self._translate, self._bulk_linger)
                    except KafkaException as exc:
                        raise TaskLogError(f"invalid Kafka producer settings: {exc.args[0]}"
                                           ) from exc
                bulk = self._bulk
        return bulk.publish(records, headers)

    def _translate(self, error: KafkaError, key: str) -> TaskLogError | EnvelopeTooLargeError:
        code = error.code()
        if code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
            return _missing_topic(self.topic)
        if code in (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_MSG_SIZE):
            return EnvelopeTooLargeError(
                f"Kafka rejected the record for {key!r} as too large ({error.str()}); "
                "lower scheduler_max_envelope_bytes or raise the topic's max.message.bytes"
            )
        if code in (KafkaError._MSG_TIMED_OUT, KafkaError._TIMED_OUT, KafkaError._TRANSPORT,
                    KafkaError._ALL_BROKERS_DOWN, KafkaError.NOT_ENOUGH_REPLICAS,
                    KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND, KafkaError.REQUEST_TIMED_OUT):
            return TaskLogUnavailableError(
                f"Kafka did not acknowledge the record for {key!r} ({error.str()}); " + UNACKNOWLEDGED
            )
        return TaskLogError(f"Kafka refused the record for {key!r}: {error.str()}")

    def flush(self, timeout: float | None = None) -> int:
        timeout = self.timeout if timeout is None else timeout
        started = time.monotonic()
        remaining: int = self._producer.flush(timeout)
        if self._bulk is not None:
            remaining += self._bulk.drain(max(0.0, timeout - (time.monotonic() - started)))
        return remaining

    def close(self) -> None:
        if self._closed.is_set():
            return
        remaining = self.flush()
        self._closed.set()
        self._poller.join(timeout=5)
        if remaining:
            logger.error("closed the Kafka task log with %d unacknowledged record(s)", remaining)
