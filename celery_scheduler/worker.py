"""The worker side: run only current releases, beat while they run, report each one's outcome.

Before a released task runs, the worker checks that the message is the key's current
release. A message carries the end of its attempt's start lease, after which the dispatcher
releases the key again if it heard nothing of it: a copy that starts later (a message a
killed worker had prefetched, given back by the broker after its visibility timeout) is
stale and skipped without a round trip. A message the broker marks as redelivered may be a
copy of a run that already happened, so for those alone the worker reads the key's status;
it skips a copy of an older attempt or of a key that already finished. When the store
cannot be read the task runs: at least once.

While a released task runs, this process beats for it on the outcomes topic
(:mod:`celery_scheduler.heartbeat`): so the dispatcher tells a long task from a dead worker,
and a task runs as long as it likes. A task whose beats have not reached Kafka for its run
lease is stopped (its process killed), since the dispatcher may release it again.

The hooks are Celery signal handlers (``task_success``, ``task_failure``) connected when a
task is decorated with ``@scheduled_task``, so any worker that imports the task reports
without further set-up. A report is produced to the scheduler's outcomes topic
(``<topic>.outcomes``), to the partition of the same number as the task's: the dispatcher
that owns that partition of the schedule reads it, records the outcome in Cassandra and only
then commits its offset, so an outcome survives a dispatcher's death. Producing never blocks
the task: the record is handed to the Kafka client, which sends it in the background (a
report lost with its worker costs a re-run, never a lost task).
"""

from __future__ import annotations

import atexit
import collections
import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from celery import signals
from celery.exceptions import Ignore, Reject

from celery_scheduler import redis_clients, redis_worker_fix
from celery_scheduler.client import get_client
from celery_scheduler.clock import now_ms
from celery_scheduler.config import Settings
from celery_scheduler.errors import SchedulerError
from celery_scheduler.heartbeat import CLOCK_MARGIN_MS, Beats
from celery_scheduler.store.base import State
from celery_scheduler.wire import HEADER, Beat, Outcome, Release, outcome_topic, parse_header
from celery_scheduler.worker_advice import warn_on_ready

__all__ = ["OutcomeProducer", "guard_stale_releases", "install_worker_hooks",
           "is_current_release", "report"]

logger = logging.getLogger(__name__)

MAX_ERROR_LENGTH = 2000
# A copy of a release is stale this long before its start lease ends, not only at the end,
# so that a worker whose clock runs a little behind the dispatcher's cannot start a copy
# that overlaps the key's next release.
STALE_MARGIN_MS = CLOCK_MARGIN_MS
# Request attribute holding when the body of a current release started (epoch ms).
STARTED = "celery_scheduler_started_ms"
# Request attribute holding the release the guard read from the header, for the outcome report.
RELEASE = "celery_scheduler_release"
# dispatch_uid of the worker_init handler that installs redis_worker_fix
REDIS_FIX_UID = "celery_scheduler.redis_worker_fix"
# dispatch_uid of the worker_init handler that makes kombu's Redis channels share their clients
REDIS_CLIENTS_UID = "celery_scheduler.redis_clients"
_installed = threading.Lock()
_hooks_connected = False


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
# An outcome is sent at most this many times: once, and once more after it timed out.
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
        if sends < MAX_SENDS:
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


_reporters: dict[tuple[int, str, str], OutcomeProducer] = {}
_reporters_lock = threading.Lock()
_beats: dict[tuple[int, str, str], Beats] = {}


def _reporter(settings: Settings) -> OutcomeProducer:
    # one per process: a Kafka client does not survive fork(), and prefork children start
    # with their parent's memory
    ident = (os.getpid(), settings.kafka_bootstrap_servers, settings.kafka_topic)
    reporter = _reporters.get(ident)
    if reporter is None:
        with _reporters_lock:
            reporter = _reporters.get(ident)
            if reporter is None:
                reporter = _reporters[ident] = OutcomeProducer(settings)
    return reporter


def _beats_of(settings: Settings) -> Beats:
    """This process's beats, through its outcome producer (one per process, as that is)."""
    ident = (os.getpid(), settings.kafka_bootstrap_servers, settings.kafka_topic)
    beats = _beats.get(ident)
    if beats is None:
        reporter = _reporter(settings)
        with _reporters_lock:
            beats = _beats.get(ident)
            if beats is None:
                beats = _beats[ident] = Beats(reporter.send_beat, reporter.poll)
    return beats


def flush_reports(timeout: float = 10.0) -> None:
    """Wait for this process's outcome reports to reach Kafka (at worker process shutdown)."""
    pid = os.getpid()
    for (owner, _, _), reporter in list(_reporters.items()):
        if owner == pid:
            left = reporter.flush(timeout)
            if left:
                logger.warning("%d outcome report(s) did not reach Kafka before shutdown; their "
                               "tasks run again when their leases end", left)


def report(task: Any, succeeded: bool, error: str | None) -> None:
    """Report the outcome of *task*'s current execution if it was released by a dispatcher."""
    release = getattr(task.request, RELEASE, None) or parse_header(getattr(task.request, HEADER, None))
    if release is None:
        return
    outcome = Outcome(release.key, release.partition, release.attempt, succeeded,
                      None if error is None else error[:MAX_ERROR_LENGTH],
                      int(getattr(task.request, STARTED, 0) or 0), now_ms(), release.lease_until_ms)
    try:
        _reporter(get_client(task._get_app()).settings).send(outcome)
    except Exception:  # the dispatcher releases the task again when its lease ends
        logger.exception("could not report the outcome of %s; it will run again when its lease "
                         "ends", outcome.key)


def _redelivered(task: Any) -> bool:
    delivery = getattr(task.request, "delivery_info", None) or {}
    return bool(delivery.get("redelivered"))


def is_current_release(task: Any) -> bool:
    """Whether *task*'s execution may run: not a release, or the key's current release."""
    release = parse_header(getattr(task.request, HEADER, None))
    return release is None or _is_current(task, release)


def _is_current(task: Any, release: Release) -> bool:
    if release.lease_until_ms and now_ms() > release.lease_until_ms - STALE_MARGIN_MS:
        logger.warning("skipping a stale copy of %s (attempt %d): its start lease has ended, so "
                       "the key is released again (or finished)", release.key, release.attempt)
        return False
    if release.lease_until_ms and not _redelivered(task):
        return True  # the copy the dispatcher sent, within its lease
    try:
        status = get_client(task._get_app()).store.status(release.key)
    except SchedulerError:
        logger.warning("could not check that %s (attempt %d) is current; running it",
                       release.key, release.attempt, exc_info=True)
        return True
    if status is None:  # unknown to the store (status expired): at least once
        return True
    current = (status.state is State.RELEASED and status.attempts == release.attempt
               and not (status.outcome and status.outcome_attempt >= release.attempt))
    if not current:
        logger.warning("skipping a stale copy of %s (attempt %d): the key is %s at attempt %d",
                       release.key, release.attempt, status.state.value, status.attempts)
    return current


def _wait_until(due_ms: int) -> int:
    """Sleep until *due_ms* (epoch ms); returns the time then.

    A release sent ahead carries its due time as Celery's ``eta`` and the worker's timer
    holds it until then, but that timer counts floating-point seconds of a monotonic clock
    and may fire a fraction of a millisecond early: a task never starts before it is due.
    """
    while (now := now_ms()) < due_ms:
        time.sleep((due_ms - now) / 1000)
    return now


def guard_stale_releases(task: Any) -> None:
    """Make *task* skip (Celery's ``Ignore``) executions that are not its key's current release."""
    run = task.run

    @functools.wraps(run)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        release = parse_header(getattr(task.request, HEADER, None))
        if release is not None and not _is_current(task, release):
            raise Ignore()
        started = now_ms()
        if release is not None and release.not_before_ms > started:
            started = _wait_until(release.not_before_ms)
        setattr(task.request, STARTED, started)  # reported with the outcome
        setattr(task.request, RELEASE, release)  # read once: the report needs it too
        if release is None or not release.run_lease_ms:
            return run(*args, **kwargs)
        beats = _beats_of(get_client(task._get_app()).settings)
        token = beats.running(release, started)
        try:
            return run(*args, **kwargs)
        except (Ignore, Reject) as exc:
            # Celery reports nothing for these: the dispatcher hears it as a failed attempt
            # now, rather than learn it from beats that stop
            report(task, False, f"the task raised {type(exc).__name__}")
            raise
        finally:
            beats.done(token)

    task.run = guarded


def _on_success(sender: Any = None, **_: Any) -> None:
    if sender is not None:
        report(sender, True, None)


def _on_failure(sender: Any = None, exception: BaseException | None = None, **_: Any) -> None:
    if sender is not None:
        report(sender, False, f"{type(exception).__name__}: {exception}" if exception else "failed")


def _on_process_shutdown(**_: Any) -> None:
    flush_reports()


def install_worker_hooks() -> None:
    """Connect the outcome reporters to Celery's signals (once per process)."""
    global _hooks_connected
    with _installed:
        if _hooks_connected:
            return
        signals.task_success.connect(_on_success, weak=False, dispatch_uid="celery_scheduler.success")
        signals.task_failure.connect(_on_failure, weak=False, dispatch_uid="celery_scheduler.failure")
        signals.worker_process_shutdown.connect(_on_process_shutdown, weak=False,
                                                dispatch_uid="celery_scheduler.flush")
        signals.worker_shutdown.connect(_on_process_shutdown, weak=False,
                                        dispatch_uid="celery_scheduler.flush_main")
        # settings that make released tasks wait in a worker (see worker_advice)
        signals.worker_ready.connect(warn_on_ready, weak=False, dispatch_uid="celery_scheduler.advice")
        # a worker on Redis that holds messages survives the broker going away (see the module)
        signals.worker_init.connect(redis_worker_fix.install, weak=False,
                                    dispatch_uid=REDIS_FIX_UID)
        # each acknowledgement on Redis without a Redis client of its own (see redis_clients)
        signals.worker_init.connect(redis_clients.install, weak=False,
                                    dispatch_uid=REDIS_CLIENTS_UID)
        atexit.register(flush_reports, 5.0)
        _hooks_connected = True
