"""Persist before commit: records polled from Kafka are written to the store, and only then
are their offsets committed.

A batch is applied in rounds (:mod:`~celery_scheduler.dispatcher.rounds`), so that records
of one ordering id take effect in the order Kafka delivered them, even when a round fails
half-way; a hot ordering id's records past the last round wait for the next batch
(:mod:`~celery_scheduler.dispatcher.carrying`). If any write fails, nothing of the batch is
committed: the consumer seeks back and the batch is applied again (writes are idempotent),
so an acknowledged schedule call is never lost. A record that cannot be decoded, or breaks
the rules a dispatcher relies on (:mod:`~celery_scheduler.dispatcher.admission`), is copied
to the dead-letter topic with the reason, and the partition moves on.

Records of a partition whose lease this process has not taken (another dispatcher holds
it, or it was just assigned) are not written: the partition is paused at the first of them
and resumed once the engine holds the lease (see :meth:`Engine.may_persist`). Offsets are
committed asynchronously: a commit that never completes (the client can hang in a
synchronous one after a broker restart) must not stop the loop, and a commit that is lost
only means records are read and written again.

At a light load a poll holds a few records of many partitions, and a key's status is read
with one request per (partition, status slot): about one read a record. While every record
of a batch is due more than ``URGENT_SECONDS`` ahead, the loop keeps reading for up to
``linger_seconds`` (``scheduler_ingest_linger_seconds``), so that one batch writes what a
second brings; a record due sooner ends the wait, and so does a cancel, a retry or a move.

Before each batch, and while it lingers, the loop asks the broker where the partitions the
engine waits for end, and tells the engine how far it has applied: once everything below an
answer is, the engine may release those partitions' tasks up to the time it asked (a cancel
acknowledged before a task's due time wins). A lingering batch counts as applied the plain
schedule calls it holds that are due after anything the engine may release meanwhile
(:func:`cannot_hold_back`): applied or not, they change no release before theirs. So a
waiting engine does not cut the batches short: at a steady load it always waits for one
partition or another, and a batch cut at every wait costs a write a few records. A task
named by its own task id may move another key: held while the engine waits, it is written
at once.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence

from celery_scheduler.clock import Clock, now_ms
from celery_scheduler.dispatcher.admission import Admission, Refused
from celery_scheduler.dispatcher.carrying import MOST_CARRIED_BATCHES, Batch, Carrier
from celery_scheduler.dispatcher.caught_up import CaughtUp
from celery_scheduler.dispatcher.engine import Engine
from celery_scheduler.dispatcher.lingering import cannot_hold_back, earliest_due
from celery_scheduler.dispatcher.rounds import MOST_ROUNDS, operation_of
from celery_scheduler.dispatcher.writing import Writer
from celery_scheduler.envelope import (
    Envelope,
)
from celery_scheduler.errors import SchedulerError, TaskLogError
from celery_scheduler.signing import Signer
from celery_scheduler.store.base import (
    Operation,
    TaskWriter,
)
from celery_scheduler.tasklog.base import PartitionEnd, Read, Record, TaskLogReader
from celery_scheduler.tasklog.dead_letters import DeadLetterSink
from celery_scheduler.tracing import DispatcherSpans

__all__ = ["CARRY_PACE_SECONDS", "Ingest", "cannot_hold_back"]

logger = logging.getLogger(__name__)

# A batch holding a record due within this long is written without lingering for more.
URGENT_SECONDS = 2.0
# How long a batch waits for records while the engine waits for its ingest to catch up.
HURRIED_SECONDS = 0.02
# A batch writing records carried (of hot ordering ids, carrying.py) at most this often,
# unless something waits for them: a pace well ahead of an ordering id run one at a time,
# that leaves the rest of the dispatcher, and the store, to the others' releases.
CARRY_PACE_SECONDS = 0.2


class Ingest:
    """Polls the scheduler topic and persists what it reads."""

    def __init__(self, consumer: TaskLogReader, store: TaskWriter, engine: Engine,
                 dead_letters: DeadLetterSink, partitions: Callable[[], int], *,
                 allowed: Callable[[str], bool] | None = None, signer: Signer | None = None,
                 max_bytes: int | None = None, batch_size: int = 1000,
                 linger_seconds: float = 0.0, clock: Clock | None = None,
                 caught_up: CaughtUp | None = None, spans: DispatcherSpans | None = None,
                 carry_pace_seconds: float = 0.0) -> None:
        self.consumer = consumer
        self.engine = engine
        self.dead_letters = dead_letters
        self.admission = Admission(partitions, allowed, signer, max_bytes)
        self.batch_size = batch_size
        self.linger_seconds = linger_seconds
        self.clock = clock or now_ms
        self.writer = Writer(store, engine, self.clock, spans)  # spans: traced tasks' persists
        self._failing_since: float | None = None  # batches fail to persist: said once
        self.paused: set[int] = set()  # partitions paused until their lease is held
        self._assigned: list[int] = []  # partitions newly assigned: not paused by us
        # partition -> offset below which every record is written (or dead-lettered), since
        # it was assigned: where a reader of its own may go on (see kept.py)
        self.written_to: dict[int, int] = {}
        # What the engine's releases wait for (None: nothing waits, as in memory): the
        # partitions read, and the offset below which all is applied, per partition
        self.caught_up = caught_up
        self.owned: set[int] = set()
        self.applied_to: dict[int, int] = {}
        self.carrier = Carrier(caught_up)  # records a batch left to the next (carrying.py)
        self.most_rounds = MOST_ROUNDS
        # a batch of records carried at most every so often, unless something waits for them
        # (see _poll; the dispatcher's is CARRY_PACE_SECONDS)
        self.carry_pace = carry_pace_seconds
        self._carry_after = 0.0  # (monotonic) when the next batch of records carried is due
        self._read_past: dict[int, int] = {}  # partition -> offset after the last record read

    def assigned(self, partitions: Iterable[int]) -> None:
        """Kafka assigned *partitions* (called from the consumer's callback, on this thread)."""
        partitions = list(partitions)
        self._assigned.extend(partitions)
        for partition in partitions:
            self.written_to.pop(partition, None)  # it goes on from the committed offset
            self.applied_to.pop(partition, None)
            self.owned.add(partition)
        self._let_go(partitions)
        if self.caught_up is not None:
            self.caught_up.forget(partitions)

    def revoked(self, partitions: Iterable[int]) -> None:
        partitions = list(partitions)
        for partition in partitions:
            self.paused.discard(partition)
            self.owned.discard(partition)
            self.applied_to.pop(partition, None)
        self._let_go(partitions)
        if self.caught_up is not None:
            self.caught_up.forget(partitions)

    def _let_go(self, partitions: list[int]) -> None:
        self.carrier.let_go(lambda partition: partition not in partitions)
        self._read_past = {p: o for p, o in self._read_past.items() if p not in partitions}

    def _resume_leased(self) -> None:
        if self._assigned:
            # a partition paused before it was revoked and then assigned again starts paused
            fresh, self._assigned = self._assigned, []
            with contextlib.suppress(TaskLogError):
                self.consumer.resume(fresh)
        ready = [partition for partition in self.paused if self.engine.may_persist(partition)]
        if ready:
            self.consumer.resume(ready)
            self.paused.difference_update(ready)

    def _hold_back(self, records: dict[int, Record]) -> None:
        """Read *records* (the first unwritten one of each partition) again once leased."""
        for record in records.values():
            with contextlib.suppress(TaskLogError):  # revoked meanwhile: its new owner reads it
                self.consumer.seek(record.partition, record.offset)
                self.consumer.pause([record.partition])
                self.paused.add(record.partition)

    def poll_once(self, timeout: float = 0.2) -> int:
        """Consume, persist and commit one batch; return how many records it held.

        While the engine waits for a partition to be caught up, the batch is asked for where
        those partitions end first and waits for records only briefly (``HURRIED_SECONDS``).
        """
        hurried = self._ask_ends()
        count = self._poll(min(timeout, HURRIED_SECONDS) if hurried else timeout)
        if self.caught_up is not None:
            for partition, offset in self.applied_to.items():
                self.caught_up.applied(partition, offset)
        return count

    def _ask_ends(self) -> bool:
        """Ask where the partitions the engine waits for end; whether it waits for any."""
        if self.caught_up is None:
            return False
        now = self.clock()  # before asking: a record acknowledged before now is below the end
        wanted = self.caught_up.to_ask(self.owned, now)
        if wanted:
            ends = self._ends(wanted)
            for partition in wanted:
                if partition in ends:
                    self.caught_up.asked(partition, now, ends[partition])
                else:  # its leader is away, say: asked again a little later
                    self.caught_up.ask_failed(partition, now)
        return self.caught_up.waiting()

    def _ends(self, partitions: list[int]) -> dict[int, int]:
        """Where *partitions* end, as far as Kafka answers. One request asks of them all; if
        it fails (one leader away fails it whole), each is asked alone, so that the others'
        tasks do not wait for that leader."""
        try:
            return self.consumer.end_offsets(partitions)
        except TaskLogError as exc:
            if len(partitions) == 1:
                logger.info("could not ask where partition %s ends (%s)", partitions[0], exc)
                return {}
        ends: dict[int, int] = {}
        for partition in partitions:
            try:
                ends |= self.consumer.end_offsets([partition])
            except TaskLogError as exc:
                logger.info("could not ask where partition %s ends (%s)", partition, exc)
        return ends

    def _poll(self, timeout: float) -> int:
        self.engine.ingest_alive()
        self._resume_leased()
        decoded: dict[tuple[int, int], Envelope] = {}
        carrying = bool(self.carrier)
        # a batch of records carried is due now, whatever else comes (see _carry_due); else
        # the poll waits until it is at most (never less than nothing: Kafka's consumer
        # waits forever on a negative timeout)
        wait = timeout
        if carrying:
            wait = 0.0 if self.carrier.waited_for() else max(0.0, self._carry_after - time.monotonic())
        try:
            messages = self.consumer.consume(self.batch_size, min(timeout, wait))
            if messages and self.linger_seconds > 0 and not carrying:
                messages = self._linger(messages, timeout, decoded)
        except TaskLogError as exc:
            logger.warning("Kafka poll failed: %s", exc)
            return 0
        carry = carrying and self._carry_due()
        if not messages and not carry:
            return 0
        if carry:
            self._carry_after = time.monotonic() + self.carry_pace
        ends: dict[int, int] = {}  # partitions read to their end, at that offset
        first: dict[int, Record] = {}  # of the records read by this poll
        last: dict[int, Record] = {}
        unleased: dict[int, Record] = {}
        writable = {p: self.engine.may_persist(p) for p in self.carrier.partitions()}
        carried = [p for p, ok in writable.items() if ok]  # partitions carrying records
        # carried records of a partition not leased are read again with it, from the first
        for head in sorted(dropped := self.carrier.let_go(writable.__getitem__),
                           key=lambda r: r.offset):
            unleased.setdefault(head.partition, head)
        # what was carried comes first, if its batch is due (else more may be carried)
        batch = Batch(self.carrier, self.most_rounds, carried=carry)
        for record in messages:
            if isinstance(record, PartitionEnd):
                ends[record.partition] = record.offset
                continue
            if record.partition not in writable:
                writable[record.partition] = self.engine.may_persist(record.partition)
            if not writable[record.partition]:
                unleased.setdefault(record.partition, record)
                continue
            first.setdefault(record.partition, record)
            last[record.partition] = record
            self._read_past[record.partition] = record.offset + 1
            envelope = self._check(record, decoded.get((record.partition, record.offset)))
            if envelope is not None:
                batch.add(record, operation_of(envelope, record.partition, record.value))
        self._hold_back(unleased)
        self._dropped(dropped)
        try:
            for round_ in batch.operations():
                self.apply(round_)
            self.dead_letters.flush()
            self._carry(batch)
            firsts = self.carrier.first_offsets()
            done = {p: firsts.get(p, self._read_past[p]) for p in {*last, *carried}}
            for partition, offset in done.items():
                self.written_to[partition] = offset
                self.applied_to[partition] = self._read_past[partition]
            for partition, offset in ends.items():
                if partition not in unleased and partition in self.owned:
                    self.applied_to[partition] = offset
            self._commit(done)
        except SchedulerError as exc:  # TaskLogError included
            # Nothing of this batch counts as done: read it again (the writes are idempotent),
            # but what was carried, carried still (and still held from the engine).
            # Tried again every second while an outage lasts: said once, and its end.
            logger.log(logging.DEBUG if self._failing_since is not None else logging.WARNING,
                       "could not persist a batch (%s); it will be applied again, every 1s "
                       "until it is", exc)
            if self._failing_since is None:
                self._failing_since = time.monotonic()
            self.carrier.failed(batch)
            self.carrier.show_held()  # still held, even if the engine forgot it meanwhile
            for record in first.values():
                # a partition revoked meanwhile cannot be sought; its new owner reads it
                with contextlib.suppress(TaskLogError):
                    self.consumer.seek(record.partition, record.offset)
                self._read_past[record.partition] = record.offset
            time.sleep(1.0)
            return 0
        if self._failing_since is not None:
            logger.warning("batches persist again, after %.1fs of failures",
                           time.monotonic() - self._failing_since)
            self._failing_since = None
        return len(messages) - len(ends) + sum(batch.taken.values())

    def _carry_due(self) -> bool:
        """Whether the next batch writes records carried: something waits for them, or the
        last batch that did is a pace ago."""
        return self.carrier.waited_for() or time.monotonic() >= self._carry_after

    def _commit(self, offsets: dict[int, int]) -> None:
        """Commit *offsets*: the batch is written whatever the answer, and a commit lost only
        means its records are read and written again."""
        try:
            if offsets:
                self.consumer.commit(offsets)
        except TaskLogError as exc:
            logger.warning("could not commit offsets %s (%s); a restart reads those records "
                           "again", offsets, exc)

    def _carry(self, batch: Batch) -> None:
        """Carry what *batch* carries to the next one (carrying.py); pause the partitions
        that carry too much, and resume them once half as much is carried."""
        pause, resume = self.carrier.written(batch, MOST_CARRIED_BATCHES * self.batch_size)
        if pause:
            logger.warning("%d records of a few ordering ids wait to be written, one of each "
                           "ordering id a round; not reading partition(s) %s until half of them "
                           "are", len(self.carrier), pause)
        for change, partitions in ((self.consumer.resume, resume), (self.consumer.pause, pause)):
            if partitions:
                with contextlib.suppress(TaskLogError):  # revoked meanwhile: its owner reads it
                    change(partitions)

    def _dropped(self, records: list[Record]) -> None:
        """Carried *records* are let go unwritten, read again once their partition's lease
        is held: what was shown of their partitions no longer holds."""
        for record in records:
            if self.applied_to.get(record.partition, 0) > record.offset:
                self.applied_to[record.partition] = record.offset
        self._let_go(partitions := list({record.partition for record in records}))
        if partitions and self.caught_up is not None:
            self.caught_up.forget(partitions)

    def _linger(self, messages: list[Read], timeout: float,
                decoded: dict[tuple[int, int], Envelope]) -> list[Read]:
        """*messages* and what is read after them, while none is due soon (see the module).

        The envelopes decoded to find the due times are kept in *decoded*, by (partition,
        offset), for ``_check``: it still checks every record before it is written.
        """
        until = time.monotonic() + self.linger_seconds
        earliest = earliest_due(messages, decoded)
        while len(messages) < self.batch_size:
            left = min(until - time.monotonic(), (earliest - self.clock()) / 1000 - URGENT_SECONDS)
            if left <= 0:
                break
            wait = min(timeout, left)
            if self._ask_ends():
                if not self._show_held(messages, decoded):
                    break  # the engine waits for a record that may hold a release back
                if self.caught_up is not None and self.caught_up.waiting():
                    wait = min(wait, HURRIED_SECONDS)  # its records are still on the way
            try:
                more = self.consumer.consume(self.batch_size - len(messages), wait)
            except TaskLogError as exc:
                # what was read is past the consumer's position: it is written now, not lost
                logger.warning("Kafka poll failed: %s", exc)
                break
            messages += more
            earliest = min(earliest, earliest_due(more, decoded))
        return messages

    def _show_held(self, messages: list[Read], decoded: dict[tuple[int, int], Envelope]) -> bool:
        """Tell the engine how far each partition is read while *messages* linger unapplied,
        as far as none of them can hold back a release it may make meanwhile; whether none
        does (else the batch is written now)."""
        assert self.caught_up is not None
        after = self.clock() + self.engine.release_ahead_ms
        read_to = dict(self.applied_to)  # what earlier batches applied, then what this one read
        held_back: set[int] = set()
        for message in messages:
            partition, offset = message.partition, message.offset
            if isinstance(message, PartitionEnd):
                read_to[partition] = max(read_to.get(partition, 0), offset)
                continue
            if not cannot_hold_back(decoded.get((partition, offset)), after):
                held_back.add(partition)
            read_to[partition] = max(read_to.get(partition, 0), offset + 1)
        for partition, offset in read_to.items():
            # a partition whose lease is not held yet has its records read again once it is
            if (partition not in held_back and partition in self.owned
                    and self.engine.may_persist(partition)):
                self.caught_up.applied(partition, offset)
        return not held_back

    def _check(self, record: Record, envelope: Envelope | None = None) -> Envelope | None:
        """*record*'s envelope, or None once it is dead-lettered (see admission.py)."""
        admitted = self.admission.admit(record, envelope)
        if isinstance(admitted, Refused):
            self.dead_letters.send(record, admitted.reason)
            return None
        return admitted

    def apply(self, operations: Sequence[Operation]) -> None:
        """Write *operations* (of distinct keys) and tell the engine (see writing.py)."""
        self.writer.apply(operations)

    @property
    def persisted_count(self) -> int:
        return self.writer.persisted_count

    def close(self) -> None:
        pass
