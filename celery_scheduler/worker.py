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
import functools
import logging
import os
import threading
import time
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
from celery_scheduler.tasklog.outcome_producer import OutcomeProducer
from celery_scheduler.wire import HEADER, Outcome, Release, parse_header
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
