"""The per-app client that schedule calls go through: settings, task log and store.

One client is cached on each Celery app. It opens the Kafka producer on first use and again
after a fork (librdkafka's threads do not survive ``fork()``, so a prefork worker or a
preloading web server gets a fresh producer in each child), and Cassandra only when a
status is asked for.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Collection
from typing import Any

from celery_scheduler.clock import now_ms
from celery_scheduler.config import Settings, get_settings
from celery_scheduler.envelope import Envelope, encode
from celery_scheduler.errors import NotUnderTestError
from celery_scheduler.signing import HEADER as SIGNATURE_HEADER
from celery_scheduler.store import open_store
from celery_scheduler.store.base import ScheduleStore
from celery_scheduler.tasklog.base import BatchAck, TaskLog

__all__ = ["SchedulerClient", "begin_testing", "end_testing", "get_client", "set_client"]

_CLIENT_ATTRIBUTE = "_celery_scheduler_client"
_client_lock = threading.Lock()

# Forks into this process so far: a client's producer and session belong to the process
# that opened them. Counting forks, rather than asking the pid on every call (a system
# call), keeps that check off the cost of a schedule call.
_forks = 0


def _forked() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_forked)


class SchedulerClient:
    """Publishes envelopes for one Celery app and answers status queries."""

    def __init__(self, settings: Settings, *, task_log: TaskLog | None = None,
                 store: ScheduleStore | None = None, clock: Callable[[], int] = now_ms) -> None:
        self.settings = settings
        self.clock = clock  # epoch ms that delays count from (the testing helper's is fake)
        self._task_log = task_log
        self._store = store
        self._signer = settings.signer
        # the process the task log and the store were made in, by the forks before it
        self._log_forks = self._store_forks = _forks
        self._lock = threading.Lock()

    @property
    def task_log(self) -> TaskLog:
        log = self._task_log
        if log is not None and self._log_forks == _forks:
            return log
        with self._lock:
            if self._task_log is None or self._log_forks != _forks:
                from celery_scheduler.tasklog.kafka import KafkaTaskLog

                s = self.settings
                self._task_log = KafkaTaskLog(
                    s.kafka_bootstrap_servers, s.kafka_topic, timeout=s.kafka_produce_timeout,
                    max_message_bytes=s.max_envelope_bytes, options=s.kafka_options)
                self._log_forks = _forks
            return self._task_log

    @property
    def store(self) -> ScheduleStore:
        with self._lock:
            if self._store is None or self._store_forks != _forks:
                # cassandra-driver's connections do not survive fork() either
                self._store = open_store(self.settings)
                self._store_forks = _forks
            return self._store

    def encode(self, envelope: Envelope) -> bytes:
        return encode(envelope, self.settings.max_envelope_bytes)

    def publish(self, envelope: Envelope, wait: bool = True) -> Any:
        """Publish *envelope* keyed by its ordering id; a Position, or a future if not *wait*."""
        return self.publish_record(envelope.key.ordering_id, self.encode(envelope), wait)

    def publish_record(self, key: str, data: bytes, wait: bool = True) -> Any:
        """Publish an encoded envelope (signed, if the app signs), keyed by ordering id *key*."""
        headers = None
        if self._signer is not None:
            headers = {SIGNATURE_HEADER: self._signer.sign(key.encode("utf-8"), data)}
        if wait:
            return self.task_log.publish(key, data, timeout=self.settings.kafka_produce_timeout,
                                         headers=headers)
        return self.task_log.publish_async(key, data, headers)

    def publish_many(self, records: Collection[tuple[str, bytes]]) -> BatchAck:
        """Publish encoded envelopes (key, data) in order, each signed if the app signs."""
        signer = self._signer
        if signer is None:
            return self.task_log.publish_many(records)

        def sign(key: str, data: bytes) -> dict[str, bytes]:
            return {SIGNATURE_HEADER: signer.sign(key.encode("utf-8"), data)}

        return self.task_log.publish_many(records, sign)

    def flush(self, timeout: float | None = None) -> int:
        """Wait for records published with ``wait=False``; return how many are still pending."""
        return 0 if self._task_log is None else self._task_log.flush(timeout)

    def close(self) -> None:
        if self._task_log is not None and self._log_forks == _forks:
            self._task_log.close()
        if self._store is not None:
            self._store.close()
        self._task_log = self._store = None


# The apps an active scheduler_testing block routes to memory (by id), and how many blocks
# route each. While any is active, a call for another app is refused rather than sent to
# the real Kafka its settings name: a @shared_task resolves Celery's current app when it is
# called, which in a process with two apps need not be the one under test.
_under_test: dict[int, tuple[Any, int]] = {}


def begin_testing(app: Any) -> None:
    """*app*'s calls go to memory from now on (the testing helper)."""
    with _client_lock:
        _, blocks = _under_test.get(id(app), (app, 0))
        _under_test[id(app)] = (app, blocks + 1)


def end_testing(app: Any) -> None:
    with _client_lock:
        _, blocks = _under_test.pop(id(app), (app, 1))
        if blocks > 1:
            _under_test[id(app)] = (app, blocks - 1)


def _not_under_test(app: Any) -> NotUnderTestError:
    tested = ", ".join(repr(getattr(a, "main", None) or a) for a, _ in _under_test.values())
    return NotUnderTestError(
        f"scheduler_testing routes the calls of Celery app {tested} to memory, but this call "
        f"is for app {getattr(app, 'main', None) or app!r}, whose calls would go to the real "
        "Kafka in its settings; refused. A @shared_task takes Celery's current app when it "
        "is called: make the app under test current (app.set_current()), or wrap the test in "
        "scheduler_testing() of every app it schedules through")


def get_client(app: Any) -> SchedulerClient:
    """Return the scheduler client of Celery *app*, creating it on first use.

    While a ``scheduler_testing`` block is active in the process, raises
    :class:`~celery_scheduler.errors.NotUnderTestError` for an app it does not route.
    """
    if _under_test and id(app) not in _under_test:
        raise _not_under_test(app)
    client = getattr(app, _CLIENT_ATTRIBUTE, None)
    if client is None:
        with _client_lock:
            client = getattr(app, _CLIENT_ATTRIBUTE, None)
            if client is None:
                client = SchedulerClient(get_settings(app))
                setattr(app, _CLIENT_ATTRIBUTE, client)
    return client


def set_client(app: Any, client: SchedulerClient | None) -> SchedulerClient | None:
    """Replace the app's client (used by the testing helper); return the previous one."""
    previous = getattr(app, _CLIENT_ATTRIBUTE, None)
    setattr(app, _CLIENT_ATTRIBUTE, client)
    return previous

