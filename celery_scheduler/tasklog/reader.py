"""The dispatcher's side of the task log: Kafka consumers seen through the reader port, in
the package's types (records, partition ends, partition numbers and offsets).

Every failure of a consumer call leaves here as a
:class:`~celery_scheduler.errors.TaskLogError` (a broker that cannot be reached as
:class:`~celery_scheduler.errors.TaskLogUnavailableError`), the way the producer's failures
leave :mod:`celery_scheduler.tasklog.kafka` and Cassandra's leave the store: the dispatcher
handles the package's errors, never the client library's.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, Message, TopicPartition

from celery_scheduler.errors import TaskLogError, TaskLogUnavailableError
from celery_scheduler.signing import HEADER as SIGNATURE_HEADER
from celery_scheduler.tasklog.base import PartitionEnd, Read, Record

__all__ = ["HandAssignedReader", "KafkaTaskLogReader", "close_aside", "end_offsets",
           "kafka_errors", "record_of"]

logger = logging.getLogger(__name__)

# How long the ingest loop waits to hear where a partition ends (it is the loop's thread).
END_OFFSET_TIMEOUT = 1.0

# Codes that say the brokers could not be reached or answered too late: waiting may cure them.
_UNAVAILABLE = frozenset({
    KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT,
    KafkaError.REQUEST_TIMED_OUT, KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.NETWORK_EXCEPTION,
    KafkaError.LEADER_NOT_AVAILABLE, KafkaError.NOT_LEADER_FOR_PARTITION,
})


@contextlib.contextmanager
def kafka_errors(what: str) -> Iterator[None]:
    """Turn the Kafka client's exceptions raised inside the block into TaskLogErrors."""
    try:
        yield
    except BufferError as exc:  # a producer's queue is full
        raise TaskLogUnavailableError(f"Kafka could not {what}: the client's queue is full") from exc
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        text = error.str() if isinstance(error, KafkaError) else str(exc)
        if isinstance(error, KafkaError) and error.code() in _UNAVAILABLE:
            raise TaskLogUnavailableError(f"Kafka could not {what}: {text}") from exc
        raise TaskLogError(f"Kafka could not {what}: {text}") from exc


def record_of(message: Message) -> Record:
    """The parts of a consumed Kafka message the dispatcher uses."""
    key, value = message.key(), message.value()
    signature = None
    for header in message.headers() or ():
        if isinstance(header, tuple) and header[0] == SIGNATURE_HEADER:
            signature = header[1]
    return Record(message.topic() or "", message.partition() or 0, message.offset() or 0,
                  key if isinstance(key, bytes) else None, value if isinstance(value, bytes) else None,
                  signature if isinstance(signature, bytes) else None)


# Called with the partition numbers Kafka assigned, revoked or took away (``on_lost``).
PartitionsChanged = Callable[[list[int]], None]


class KafkaTaskLogReader:
    """A consumer of the scheduler topic's group, as the ingest loop reads it
    (see :class:`~celery_scheduler.tasklog.base.TaskLogReader`).

    *make_consumer* makes the Kafka consumer, again each time the group is joined anew
    (:meth:`rejoin`). The group's callbacks reach :meth:`subscribe`'s functions with
    partition numbers, on the thread that calls :meth:`consume`; a replaced consumer's
    never do.
    """

    def __init__(self, topic: str, make_consumer: Callable[[], Consumer]) -> None:
        self.topic = topic
        self._make_consumer = make_consumer
        self.consumer = make_consumer()
        self._callbacks: tuple[PartitionsChanged, PartitionsChanged, PartitionsChanged] | None = None

    def consume(self, num_messages: int = 1, timeout: float = 0.0) -> list[Read]:
        with kafka_errors("read the scheduler topic"):
            # librdkafka takes any negative timeout, however small, as "wait forever"
            messages: list[Message] = self.consumer.consume(num_messages, max(0.0, timeout))
        read: list[Read] = []
        for message in messages:
            error = message.error()
            if error is None:
                read.append(record_of(message))
            elif error.code() == KafkaError._PARTITION_EOF:
                read.append(PartitionEnd(message.partition() or 0, message.offset() or 0))
            else:
                logger.warning("Kafka reported %s", error)
        return read

    def seek(self, partition: int, offset: int) -> None:
        with kafka_errors(f"seek partition {partition} to {offset}"):
            self.consumer.seek(TopicPartition(self.topic, partition, offset))

    def pause(self, partitions: Collection[int]) -> None:
        with kafka_errors("pause partitions"):
            self.consumer.pause(self._topic_partitions(partitions))

    def resume(self, partitions: Collection[int]) -> None:
        with kafka_errors("resume partitions"):
            self.consumer.resume(self._topic_partitions(partitions))

    def commit(self, offsets: Mapping[int, int]) -> None:
        with kafka_errors("commit offsets"):
            self.consumer.commit(offsets=[TopicPartition(self.topic, p, o) for p, o in offsets.items()],
                                 asynchronous=True)

    def end_offsets(self, partitions: Collection[int]) -> dict[int, int]:
        return end_offsets(self.consumer, self._topic_partitions(partitions), END_OFFSET_TIMEOUT)

    def _topic_partitions(self, partitions: Iterable[int]) -> list[TopicPartition]:
        return [TopicPartition(self.topic, partition) for partition in partitions]

    def subscribe(self, assigned: PartitionsChanged, revoked: PartitionsChanged,
                  lost: PartitionsChanged) -> None:
        """Join the group: Kafka's assignments reach these functions from now on."""
        self._callbacks = (assigned, revoked, lost)
        consumer = self.consumer

        def relay(index: int) -> Callable[[Consumer, list[TopicPartition]], None]:
            def changed(by: Consumer, partitions: list[TopicPartition]) -> None:
                if by is consumer is self.consumer and self._callbacks is not None:
                    self._callbacks[index]([tp.partition for tp in partitions])
            return changed

        with kafka_errors(f"subscribe to {self.topic}"):
            consumer.subscribe([self.topic], on_assign=relay(0), on_revoke=relay(1),
                               on_lost=relay(2))

    def rejoin(self) -> None:
        """Join the group again with a new consumer: the one it replaces (out of the group,
        it seems) is closed aside, and its callbacks reach nobody."""
        old, self.consumer = self.consumer, self._make_consumer()
        if self._callbacks is not None:
            self.subscribe(*self._callbacks)
        close_aside(old, "a consumer out of the group")

    def close(self) -> None:
        with kafka_errors("close the consumer"):
            self.consumer.close()

    def close_aside(self, what: str) -> None:
        """Close the consumer on a thread of its own (see :func:`close_aside`)."""
        close_aside(self.consumer, what)


class HandAssignedReader(KafkaTaskLogReader):
    """A consumer of the group's that never joins it: partitions are assigned by hand and
    nothing is committed (the kept partitions' reader, see ``dispatcher/kept.py``)."""

    def commit(self, offsets: Mapping[int, int]) -> None:
        pass

    def assign(self, offsets: Mapping[int, int | None]) -> None:
        """Read each partition from its offset (None: from the group's committed one)."""
        with kafka_errors("assign partitions"):
            self.consumer.incremental_assign([
                TopicPartition(self.topic, partition, OFFSET_INVALID if offset is None else offset)
                for partition, offset in offsets.items()])

    def unassign(self, partitions: Collection[int]) -> None:
        with kafka_errors("unassign partitions"):
            self.consumer.incremental_unassign(self._topic_partitions(partitions))


def end_offsets(consumer: Consumer, partitions: list[TopicPartition],
                timeout: float) -> dict[int, int]:
    """Where each of *partitions* ends (the offset the next message will take), asked in one
    request per leader; a partition Kafka gave no answer for is left out. Raises
    ``TaskLogError`` when Kafka does not answer within *timeout* seconds."""
    asked = [TopicPartition(tp.topic, tp.partition, -1) for tp in partitions]  # -1: the latest
    with kafka_errors("ask where the partitions end"):
        answer = consumer.offsets_for_times(asked, timeout=timeout)
    return {tp.partition: tp.offset for tp in answer if tp.error is None and tp.offset >= 0}


def close_aside(consumer: Consumer, what: str) -> None:
    """Close *consumer*, one no longer read, on a thread of its own (a consumer that stopped
    working may take long to close); its errors are only logged."""

    def close() -> None:
        try:
            with kafka_errors(f"close {what}"):
                consumer.close()
        except TaskLogError as exc:
            logger.info("%s", exc)

    threading.Thread(target=close, daemon=True, name="celery-scheduler-consumer-close").start()
