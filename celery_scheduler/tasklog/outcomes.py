"""The dispatcher's outcome reader: workers' reports, from the outcomes topic to the engine.

Workers produce each outcome to the partition of ``<topic>.outcomes`` numbered like the
task's schedule partition (see :mod:`celery_scheduler.worker`). The dispatcher that
owns schedule partition *p* reads outcomes partition *p*, from the offset committed for it,
and hands each batch to its engine. The engine applies the outcomes (the next task of an
ordering id goes at once) and writes them to Cassandra; only once those writes are
acknowledged does it mark the batch's offsets durable, and only durable offsets are
committed. A new owner therefore reads again every outcome whose effect may not be stored,
and a crash between a worker's report and its write loses nothing.

The offsets are committed under a group of their own (``<group>.outcomes``). Its consumer
never subscribes: partitions are assigned by hand, following the schedule topic's
assignment, so Kafka's group protocol only keeps the offsets.

A lease that ends without an outcome means the task runs again, so the engine must know
that the outcome is not merely unread. About once a second the reader asks Kafka where each
of its partitions ends, and once it has read that far it knows every outcome produced before
it asked (:meth:`OutcomeReader.read_until`); the engine judges a lease only when that time is
past the lease's end. A partition whose end Kafka did not give (an answer may leave some
out, just after a broker restart) is asked for again at the next check. A consumer that
stops fetching (a client may, after a broker restart, with no error: librdkafka issue #5153)
shows as a partition whose check does not complete while nothing of it arrives, whatever
its other partitions do; the reader then replaces its consumer and goes on from where it
was.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from celery_scheduler.errors import TaskLogError
from celery_scheduler.tasklog.reader import close_aside, end_offsets, kafka_errors
from celery_scheduler.wire import Beat, Outcome, OutcomeBatch, decode_report

__all__ = ["OutcomeReader"]

logger = logging.getLogger(__name__)

# Most records read in one go.
BATCH = 2000
# How long a read waits for the first record; bounds how soon an assignment takes effect.
POLL_SECONDS = 0.05
# Longest the broker holds a fetch of outcomes back to fill it (milliseconds): the most an
# ordering id's next task waits for the outcome of the one before, beyond its delivery.
# Each fetch costs the broker CPU: at 100 tasks/s, a fetch every 10 ms was half of Kafka's
# CPU per task (3.9 ms against 2.1 ms with 50 ms; 2.0 ms with 100 ms).
FETCH_WAIT_MS = 50
# How often the reader asks where its partitions end (seconds): how far behind the time up to
# which it knows it has read everything may be, when it keeps up.
CHECK_SECONDS = 1.0
# A check that has not completed, with nothing read meanwhile, for this long (seconds) means
# that the consumer has stopped fetching: it is replaced.
STALL_SECONDS = 5.0
# Longest a request for the partitions' ends may take (seconds).
ENDS_TIMEOUT = 2.0


class OutcomeReader:
    """Reads the outcomes partitions this dispatcher owns and commits what is stored.

    *deliver* gets each batch (on the reader's thread); *durable* returns the offsets whose
    outcomes' effects are stored (called on the reader's thread, and on revocation).
    """

    def __init__(self, config: dict[str, Any], topic: str, group_id: str,
                 deliver: Callable[[OutcomeBatch], None],
                 durable: Callable[[], dict[int, int]]) -> None:
        self.topic = topic
        self._deliver = deliver
        self._durable = durable
        self._config = {
            **config,
            "group.id": group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            # The end of each partition is reported: how the reader knows it has read it all.
            "enable.partition.eof": True,
            # Gather up to FETCH_WAIT_MS of outcomes per fetch: a fetch per record (the
            # default answers as soon as one byte is there) costs the broker more CPU than
            # the task it reports; the wait adds at most that to an ordering id's next release.
            "fetch.wait.max.ms": FETCH_WAIT_MS,
            "fetch.min.bytes": 1 << 20,
            **{key: value for key, value in config.items() if key.startswith("fetch.")},
        }
        self._consumer = Consumer(self._config)
        self._lock = threading.Lock()  # the consumer: assignments come from another thread
        self._assigned: set[int] = set()
        self._committed: dict[int, int] = {}
        # Per partition: the offset it is known to be read up to (messages and ends reported),
        # and the wall time (ms) before which every outcome produced to it has been read.
        self._reached: dict[int, int] = {}
        self._read_until: dict[int, int] = {}
        # The check under way: when it was asked (wall ms; monotonic), and the partitions'
        # ends (None until Kafka answers).
        self._check: tuple[int, float, dict[int, int] | None] | None = None
        self._next_check = 0.0
        self._ends_unanswered = False  # the last ask for the partitions' ends failed
        self._progress: dict[int, float] = {}  # per partition: when it was last read (monotonic)
        self.replaced = 0  # consumers replaced because they stopped fetching
        self._thread: threading.Thread | None = None

    def assign(self, partitions: Iterable[int]) -> None:
        """Start reading *partitions* from their committed offsets."""
        new = [TopicPartition(self.topic, number) for number in partitions
               if number not in self._assigned]
        if not new:
            return
        with self._lock:
            with kafka_errors("assign outcome partitions"):
                self._consumer.incremental_assign(new)
            self._assigned.update(tp.partition for tp in new)
            for tp in new:
                self._read_until[tp.partition] = 0
                self._progress[tp.partition] = time.monotonic()
            self._check, self._next_check = None, 0.0  # a check that covers them, at once

    def revoke(self, partitions: Iterable[int]) -> None:
        """Commit what is stored of *partitions*, then stop reading them.

        The commit is not waited for: a hand-over while Kafka is away would wait for it to
        come back (a synchronous commit has no timeout), and the partitions' new owner would
        wait too. An offset that does not reach Kafka only makes the next owner read some
        outcomes again, which changes nothing.
        """
        gone = [number for number in partitions if number in self._assigned]
        if not gone:
            return
        with self._lock:
            self._commit(set(gone))
            with kafka_errors("unassign outcome partitions"):
                self._consumer.incremental_unassign([TopicPartition(self.topic, n) for n in gone])
            self._assigned.difference_update(gone)
            for number in gone:
                self._committed.pop(number, None)
                self._reached.pop(number, None)
                self._read_until.pop(number, None)
                self._progress.pop(number, None)

    def read_until(self, partition: int) -> int:
        """The wall time (ms) before which every outcome produced to *partition* has been read.

        0 for a partition not read yet; a partition not assigned here has nothing to read.
        """
        return self._read_until.get(partition, 0)

    def start(self, stopped: threading.Event) -> threading.Thread:
        self._thread = threading.Thread(target=self._run, args=(stopped,), daemon=True,
                                        name="celery-scheduler-outcomes")
        self._thread.start()
        return self._thread

    def _run(self, stopped: threading.Event) -> None:
        next_commit = 0.0
        while not stopped.is_set():
            try:
                self.read_once()
                self.check()
                now = time.monotonic()
                if now >= next_commit:
                    next_commit = now + 0.5
                    with self._lock:
                        self._commit(set(self._assigned))
            except Exception:  # a Kafka outage: outcomes wait in the topic
                logger.exception("reading outcomes failed; retrying in 1s")
                stopped.wait(1.0)

    def read_once(self) -> int:
        """Read one batch and deliver it; return how many outcomes it held."""
        with self._lock:
            if not self._assigned:
                messages: list[Any] = []
            else:
                with kafka_errors("read outcomes"):
                    messages = self._consumer.consume(BATCH, POLL_SECONDS)
        if not self._assigned:
            time.sleep(POLL_SECONDS)
        outcomes: list[Outcome] = []
        beats: list[Beat] = []
        offsets: dict[int, int] = {}
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    self._note_reached(message.partition(), message.offset())
                else:
                    logger.warning("reading outcomes: %s", error)
                continue
            offsets[message.partition()] = message.offset() + 1
            report = decode_report(message.value())
            if isinstance(report, Outcome):
                outcomes.append(report)
            elif isinstance(report, Beat):
                beats.append(dataclasses.replace(report, offset=message.offset()))
            else:
                logger.warning("ignoring an outcome record that is not one: %r", message.value()[:200])
        if offsets:
            self._deliver(OutcomeBatch(outcomes, offsets, beats=beats))
            for number, offset in offsets.items():
                self._note_reached(number, offset)
        return len(outcomes)

    def _note_reached(self, partition: int, offset: int) -> None:
        if partition in self._assigned and offset > self._reached.get(partition, -1):
            self._reached[partition] = offset
            self._progress[partition] = time.monotonic()

    def check(self) -> None:
        """Advance :meth:`read_until` where the last check's ends are read; replace a stalled
        consumer; ask for the ends again when it is time."""
        now = time.monotonic()
        if not self._assigned:
            self._check = None
            return
        if self._check is None:
            if now < self._next_check:
                return
            self._check = (int(time.time() * 1000), now, None)
        asked_ms, asked_mono, ends = self._check
        if ends is None or not self._assigned <= ends.keys():
            # the ends Kafka has not given yet; an end given later than the check was asked
            # is as good (everything produced before the ask lies before it)
            answer = self._ends()
            if answer is not None:
                ends = {**answer, **(ends or {})}
                self._check = (asked_ms, asked_mono, ends)
        behind = []
        for number in self._assigned:
            end = None if ends is None else ends.get(number)
            if end is not None and self._reached.get(number, -1) >= end:
                self._read_until[number] = max(self._read_until.get(number, 0), asked_ms)
            elif self._read_until.get(number, 0) < asked_ms:
                behind.append(number)
        if not behind:
            self._check, self._next_check = None, now + CHECK_SECONDS
            return
        if any(now - max(asked_mono, self._progress.get(number, 0.0)) > STALL_SECONDS
               for number in behind):
            self._replace_consumer(ends)

    def _ends(self) -> dict[int, int] | None:
        """Each assigned partition's end offset, or None if Kafka does not say in time."""
        with self._lock:
            asked = [TopicPartition(self.topic, number) for number in sorted(self._assigned)]
            try:
                ends = end_offsets(self._consumer, asked, ENDS_TIMEOUT)
            except TaskLogError as exc:
                # asked again at every check while Kafka is away: said once, not 20 times a second
                logger.log(logging.DEBUG if self._ends_unanswered else logging.INFO, "%s", exc)
                self._ends_unanswered = True
                return None
        if self._ends_unanswered:
            logger.info("Kafka answers again where the outcome partitions end")
            self._ends_unanswered = False
        return ends

    def _replace_consumer(self, ends: dict[int, int] | None) -> None:
        """A new consumer, reading each partition from where this one got to."""
        with self._lock:
            behind = {n: (self._reached.get(n), (ends or {}).get(n)) for n in sorted(self._assigned)}
            logger.warning("the outcome reader has read nothing for %.0fs while behind "
                           "(partition: (read up to, end) %s); replacing its Kafka consumer",
                           STALL_SECONDS, behind)
            old, self._consumer = self._consumer, Consumer(self._config)
            close_aside(old, "a stalled outcome consumer")
            # from the next offset not read, or (none read) from the committed offset
            start = [TopicPartition(self.topic, n, self._reached[n]) if n in self._reached
                     else TopicPartition(self.topic, n) for n in sorted(self._assigned)]
            with kafka_errors("assign outcome partitions"):
                self._consumer.incremental_assign(start)
            self.replaced += 1
        self._check, self._next_check = None, 0.0
        self._progress = dict.fromkeys(self._assigned, time.monotonic())

    def _commit(self, partitions: set[int]) -> None:
        """Commit, without waiting, the durable offsets of *partitions* not committed yet."""
        durable = self._durable()
        due = [TopicPartition(self.topic, number, offset) for number, offset in durable.items()
               if number in partitions and self._committed.get(number, -1) < offset]
        if not due:
            return
        try:
            with kafka_errors("commit outcome offsets"):
                self._consumer.commit(offsets=due, asynchronous=True)
        except TaskLogError as exc:  # read again by the next owner: harmless
            logger.info("Kafka did not take an outcome offset commit (%s)", exc)
            return
        for tp in due:
            self._committed[tp.partition] = tp.offset

    def close(self) -> None:
        with self._lock:
            self._commit(set(self._assigned))  # sent before the consumer closes
            with kafka_errors("close the outcome reader"):
                self._consumer.close()

