"""What a lingering batch may leave unapplied while the engine waits (see ingest.py): pure
functions of the envelopes read."""

from __future__ import annotations

from typing import TypeGuard

from celery_scheduler.decoding import decode
from celery_scheduler.envelope import Envelope, ScheduleEnvelope
from celery_scheduler.errors import EnvelopeDecodeError
from celery_scheduler.tasklog.base import PartitionEnd, Read

__all__ = ["cannot_hold_back", "earliest_due", "plain_call"]


def plain_call(envelope: Envelope | None) -> TypeGuard[ScheduleEnvelope]:
    """Whether *envelope* is a plain schedule call: it adds one task and changes no other
    (not a cancel, a retry, a move, or a task named by its own task id, which may move
    another key)."""
    return isinstance(envelope, ScheduleEnvelope) and "task_id" not in envelope.options


def cannot_hold_back(envelope: Envelope | None, after_ms: int) -> bool:
    """Whether *envelope*, read but not yet applied, can change no release of a task due at
    or before *after_ms*: a plain schedule call due later. It adds a task after those of its
    ordering id due by then, applied or not."""
    return plain_call(envelope) and envelope.key.scheduled_ms > after_ms


def earliest_due(messages: list[Read], decoded: dict[tuple[int, int], Envelope]) -> int:
    """The earliest scheduled time (ms) of *messages*; 0 if one has none (a cancel, say)."""
    earliest = 2**63 - 1
    for message in messages:
        if isinstance(message, PartitionEnd) or message.value is None:
            continue
        try:
            envelope = decode(message.value)
        except EnvelopeDecodeError:
            return 0  # dead-lettered once checked: no reason to wait
        decoded[(message.partition, message.offset)] = envelope
        # a cancel, a retry or a move is written at once: a cancel must beat its task's release
        if not isinstance(envelope, ScheduleEnvelope):
            return 0
        earliest = min(earliest, envelope.key.scheduled_ms)
    return earliest
