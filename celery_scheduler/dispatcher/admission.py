"""Which records of the scheduler topic a dispatcher writes, and why it refuses the others.

A record is written only if it has a value within the size limit, carries a valid signature
(when signing is on), decodes, is keyed by its ordering id, sits in the partition Kafka's
Java partitioner gives that ordering id, and names a registered scheduled task (or is a
valid delayed Kafka message). :func:`admit` decides it without I/O; the ingest loop copies a
refused record to the dead-letter topic with the reason it gives.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from celery_scheduler.decoding import decode
from celery_scheduler.envelope import Envelope, ScheduleEnvelope
from celery_scheduler.errors import EnvelopeDecodeError
from celery_scheduler.messages import MESSAGE_TASK, DelayedMessage
from celery_scheduler.partitioner import partition_for
from celery_scheduler.signing import Signer
from celery_scheduler.tasklog.base import Record

__all__ = ["Admission", "Refused"]


@dataclass(frozen=True)
class Refused:
    """Why a record is not written: said with it on the dead-letter topic."""

    reason: str


@dataclass(frozen=True)
class Admission:
    """The rules a record must keep: *partitions* says how many the topic has (asked each
    time: it may grow), *allowed* whether a task name is a registered scheduled task (None:
    any), *signer* checks signatures (None: unsigned), *max_bytes* bounds a record's value."""

    partitions: Callable[[], int]
    allowed: Callable[[str], bool] | None = None
    signer: Signer | None = None
    max_bytes: int | None = None

    def admit(self, record: Record, envelope: Envelope | None = None) -> Envelope | Refused:
        """*record*'s envelope (*envelope* if it was decoded already), or why it is refused."""
        if record.value is None:
            return Refused("record has no value")
        if self.max_bytes is not None and len(record.value) > self.max_bytes:
            # a producer that bypassed the schedule call's limit would otherwise cost every
            # dispatcher that loads it this much memory per task
            return Refused(f"record is {len(record.value)} bytes, over the limit of "
                           f"{self.max_bytes} (scheduler_max_envelope_bytes)")
        if self.signer is not None:
            problem = self.signer.problem(record.key, record.value, record.signature)
            if problem is not None:
                return Refused(problem)
        if envelope is None:
            try:
                envelope = decode(record.value)
            except EnvelopeDecodeError as exc:
                return Refused(exc.reason)
        ordering_id = envelope.key.ordering_id
        if record.key is None or record.key != ordering_id.encode("utf-8"):
            return Refused(f"record key {record.key!r} is not the ordering id {ordering_id!r}")
        expected = partition_for(ordering_id, self.partitions())
        if record.partition != expected:
            return Refused(f"ordering id {ordering_id!r} belongs in partition {expected}, not "
                           f"{record.partition}: the producer does not use Kafka's Java partitioner")
        if isinstance(envelope, ScheduleEnvelope) and envelope.task == MESSAGE_TASK:
            try:
                DelayedMessage.of(envelope)  # a delayed Kafka message: no task to look up
            except EnvelopeDecodeError as exc:
                return Refused(f"not a valid delayed Kafka message: {exc.reason}")
        elif (isinstance(envelope, ScheduleEnvelope) and self.allowed is not None
                and not self.allowed(envelope.task)):
            return Refused(f"task {envelope.task!r} is not a registered scheduled task")
        return envelope
