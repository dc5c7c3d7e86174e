"""A dispatcher process: one member of the Kafka consumer group on the scheduler topic.

Wires the parts together: the ingest loop on the main thread, the release engine on its
own thread, and the outcome reader on a third. Several dispatchers (on one or
many hosts) share the partitions; Kafka's cooperative-sticky assignment moves only the
partitions that change owner, and Cassandra partition leases make sure two dispatchers
never release from one partition at the same time.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from celery_scheduler import registry
from celery_scheduler import release as releasing
from celery_scheduler.config import Settings, get_settings
from celery_scheduler.dispatcher.caught_up import CaughtUp
from celery_scheduler.dispatcher.engine import Engine, EngineSettings
from celery_scheduler.dispatcher.firer import firer_of
from celery_scheduler.dispatcher.ingest import CARRY_PACE_SECONDS, Ingest
from celery_scheduler.dispatcher.kept import KeptReader
from celery_scheduler.dispatcher.membership import Membership
from celery_scheduler.dispatcher.pace import ON_TIME_SWITCH_INTERVAL
from celery_scheduler.dispatcher.routing import Router, held_by_worker
from celery_scheduler.errors import (
    ConfigurationError,
    SchedulerError,
    StoreUnavailableError,
    TaskLogError,
    TaskLogUnavailableError,
)
from celery_scheduler.metrics import Metrics
from celery_scheduler.store import open_store
from celery_scheduler.store.base import ScheduleStore
from celery_scheduler.tasklog.base import TaskLogReader
from celery_scheduler.tasklog.clients import DispatcherClients, topic_problems
from celery_scheduler.tasklog.topics import dead_letter_topic, dispatcher_group, outcome_topic
from celery_scheduler.tracing import DispatcherSpans

__all__ = ["Dispatcher", "check", "engine_settings", "open_checked_store", "when_available"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

# While partitions are kept after a lost group session, the ingest loop reads them and the
# group's consumer in turn, each poll waiting at most this long (seconds).
KEPT_POLL_SECONDS = 0.05
# Longest a success waits in memory for others to share its request (seconds): at light
# load each step read a few outcomes, and stored them with a request of their own. At
# 100 tasks/s, 0.6 s took Cassandra from 1.15 to 0.90 status writes a task and its CPU a
# task down by about a sixth against 0.2 s; a success due to unblock its ordering id's
# next task is stored at once, whatever this says.
FINISH_LINGER_SECONDS = 0.6
# The collector's thresholds (gc.set_threshold) while the dispatcher runs. With Python's
# (700, 10, 10), draining a backlog of 60,000 tasks ran 3,300 young, 300 middle and 21 full
# collections, 3 s of 11 s of CPU: a full collection walks every task loaded (60-200 ms
# each). Most of what the collector frees here dies young (each Cassandra request leaves
# a cycle, its future and timer, holding the request), so collecting the youngest every
# 20,000 objects instead of 700 frees as much and promotes far less: 55 young and 2 middle
# collections, no full one, and 10-15% less dispatcher CPU a task. A young collection then
# takes 5-10 ms; at 100 tasks/s the lateness p99 stayed where it was (4.8-6.0 ms against
# 4.7-6.3 ms in alternated runs of ``python -m benchmarks.statements``).
GC_THRESHOLDS = (20_000, 20, 20)


def engine_settings(settings: Settings) -> EngineSettings:
    return EngineSettings(start_lease_seconds=settings.start_lease_seconds,
                          lease_seconds=settings.lease_seconds,
                          partition_lease_seconds=settings.partition_lease_seconds,
                          on_exhausted=settings.on_exhausted,
                          max_loaded=settings.max_loaded_per_partition,
                          lookahead_seconds=settings.lookahead_seconds,
                          max_in_flight=settings.max_in_flight,
                          release_ahead_seconds=settings.release_ahead_seconds,
                          finish_linger_seconds=FINISH_LINGER_SECONDS)


def when_available(name: str, connect: Callable[[], T], deadline: float,
                   stopping: threading.Event) -> T:
    """Call *connect* until *name* answers (it raised no ``*UnavailableError``) or *deadline*.

    A dispatcher started by a supervisor beside its services (or restarted while one of them
    restarts) waits for them, as a Celery worker waits for its broker, instead of exiting at
    once. Errors that waiting cannot cure (a missing topic or schema, bad credentials that
    the driver reports as such, bad settings) are raised at once.
    """
    delay = 0.5
    while True:
        try:
            return connect()
        except (StoreUnavailableError, TaskLogUnavailableError) as exc:
            left = deadline - time.monotonic()
            if left <= 0 or stopping.is_set():
                raise
            wait = min(delay, left)
            logger.warning("%s is not available yet (%s); retrying in %.1fs (giving up in %.0fs, "
                           "scheduler_startup_timeout)", name, exc, wait, left)
            stopping.wait(wait)
            delay = min(delay * 2, 10.0)


def open_checked_store(settings: Settings) -> ScheduleStore:
    """The schedule store, once its schema is the one this version writes.

    Checked as part of connecting: a Cassandra that goes away between the two (a restart
    under way) is an outage to wait out, and the store opened first is closed.
    """
    store = open_store(settings)
    try:
        store.check_schema()  # a keyspace made by an older version: run init first
    except BaseException:
        store.close()
        raise
    return store


class Dispatcher:
    """Runs until :meth:`stop` is called (from a signal handler or another thread)."""

    def __init__(self, app: Any, *, group_id: str | None = None, owner: str | None = None,
                 settings: Settings | None = None, metrics: Metrics | None = None) -> None:
        self.app = app
        app.tasks  # noqa: B018 - finalizes the app: DurableEtaTask tasks register when bound
        names = registry.names(app)  # the app's own: another app's tasks are not released
        if not names:
            logger.warning(
                "no @scheduled_task is registered in this process: only delayed Kafka messages "
                "(schedule_message) will be delivered, and every task record dead-lettered; "
                "run the dispatcher with the app whose modules define the scheduled tasks "
                "(celery -A proj scheduler dispatch), or list them in the app's imports/include")
        else:
            logger.info("releasing scheduled tasks: %s", ", ".join(sorted(names)))
        self.settings = settings or get_settings(app)
        s = self.settings
        self.group_id = group_id or dispatcher_group(s.kafka_topic)
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.stopping = threading.Event()
        deadline = time.monotonic() + s.startup_timeout
        kafka = DispatcherClients(s, self.owner, self.group_id)
        self._partitions = when_available("Kafka", kafka.partitions(s.kafka_topic), deadline,
                                          self.stopping)
        self.store = when_available("Cassandra", lambda: open_checked_store(s), deadline,
                                    self.stopping)
        self.metrics = metrics or Metrics()
        self.publisher = releasing.Publisher(app)  # used by one thread only
        self.spans = DispatcherSpans(s.opentelemetry)  # traced tasks' persist and release spans
        router = Router(self.publisher, self.spans)
        self.engine = Engine(self.store, router.publish, self.owner, engine_settings(s),
                             metrics=self.metrics, publish_many=router.publish_many,
                             sends_early=held_by_worker if s.release_eta else None,
                             prepare_many=router.prepare_many, publish_prepared=router.send_prepared,
                             confirm=self.publisher.collect_confirms,
                             switch_interval=sys.setswitchinterval)
        self.engine.partition_count = self._partitions  # its share of a rate limit
        self.store.fence_writes(self.engine.write_fence)
        # delayed Kafka messages (schedule_message) go here instead of to Celery
        self.delivery = router.delivery = kafka.delivery(self.engine.outcomes)
        counts = [when_available("Kafka", kafka.partitions(topic), deadline, self.stopping)
                  for topic in (dead_letter_topic(s.kafka_topic), outcome_topic(s.kafka_topic))]
        if counts[1] != self._partitions:
            raise ConfigurationError(
                f"Kafka topic {outcome_topic(s.kafka_topic)!r} has {counts[1]} partitions but "
                f"{s.kafka_topic!r} has {self._partitions}: workers report a task's outcome to the "
                "partition of the same number; run `celery -A <your app> scheduler init` to see "
                "how to make them match")
        self.outcomes = kafka.outcome_reader(self.engine.outcomes, self.engine.durable_outcome_offsets)
        self.engine.hears(outcomes_read_until=self.outcomes.read_until)
        self.reader = kafka.group_reader()
        # the engine releases a partition's tasks once its ingest has caught up (caught_up.py)
        caught_up = CaughtUp()
        self.engine.hears(caught_up=caught_up)
        self.membership = Membership(self._partitions, time.monotonic())
        dead_letters = kafka.dead_letters(self.metrics)

        def ingest(reader: TaskLogReader, linger_seconds: float) -> Ingest:
            return Ingest(reader, self.store, self.engine, dead_letters, lambda: self._partitions,
                          allowed=names.__contains__, signer=s.signer,
                          max_bytes=s.max_envelope_bytes, linger_seconds=linger_seconds,
                          caught_up=caught_up, spans=self.spans,
                          carry_pace_seconds=CARRY_PACE_SECONDS)

        self.ingest = ingest(self.reader, s.ingest_linger_seconds)
        # periodic entries (beat_schedule), fired between two polls (firer.py)
        self.firer = firer_of(app, s, self.store, self.ingest.apply, self.engine.may_persist,
                              self._partitions, certain=self.engine.leases.certain)
        # kept partitions are read while the group forms again: each record is written at
        # once, the group is waited for only as long as a short poll
        self.kept = KeptReader(kafka.kept_reader, lambda reader: ingest(reader, 0.0))

    @property
    def partition_count(self) -> int:
        """How many partitions the scheduler topic has."""
        return self._partitions

    def _on_assign(self, partitions: list[int]) -> None:
        kept = self.membership.kept
        self._hand_over(self.membership.assigned(partitions, time.monotonic()))
        if kept:
            logger.info("the group assigned partitions %s again; kept %s",
                        sorted(partitions), sorted(set(kept) & set(partitions)))
        self.ingest.assigned(partitions)
        self.engine.assign(partitions)
        self.outcomes.assign(partitions)

    def _on_revoke(self, partitions: list[int]) -> None:
        self.membership.revoked(partitions, time.monotonic())
        self.ingest.revoked(partitions)
        self._hand_over(partitions)

    def _on_lost(self, partitions: list[int]) -> None:
        """Kafka ended the group session (a broker away for longer than it): keep releasing
        from the partitions while their leases are held, until the group forms again
        (see :mod:`celery_scheduler.dispatcher.membership`)."""
        now = time.monotonic()
        self.membership.lost(partitions, now)
        self.ingest.revoked(partitions)
        logger.warning("Kafka ended this dispatcher's group session and took partitions %s; it "
                       "goes on releasing those it holds the lease of until the group assigns "
                       "them again (for up to %.0fs)", sorted(partitions),
                       self.membership.lost_hold_seconds)
        self._hand_over(self.membership.lost_to_give_up(now, self.engine.may_persist))

    def _hand_over(self, numbers: list[int]) -> None:
        """Stop releasing from partitions *numbers*, give their leases up, commit their outcomes."""
        if not numbers:
            return
        started = time.monotonic()
        if not self.engine.revoke(numbers):
            logger.error("partitions %s were not handed over in time", numbers)
        self.outcomes.revoke(numbers)
        logger.info("handed over partitions %s in %.3fs", numbers, time.monotonic() - started)

    def run(self) -> None:
        s = self.settings
        logger.info("dispatcher %s joining group %s on %s (%d partitions)", self.owner,
                    self.group_id, s.kafka_topic, self._partitions)
        self._subscribe()
        # the process is the dispatcher's alone; the engine lengthens it while behind (pace.py)
        sys.setswitchinterval(ON_TIME_SWITCH_INTERVAL)
        # What is alive now (modules, the app, the clients) lives as long as the process:
        # frozen, the collector no longer walks it. A full collection of it held every
        # thread for 50-85 ms, the sender's too, while tasks fell due.
        gc.collect()
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
        engine_thread = self.engine.start()
        self.outcomes.start(self.stopping)
        try:
            while not self.stopping.is_set():
                self.ingest.poll_once(KEPT_POLL_SECONDS if self.kept.partitions else 0.2)
                if self.firer is not None:
                    self.firer.step()
                if not engine_thread.is_alive():
                    raise SchedulerError("the release engine stopped unexpectedly")
                self._keep_membership()
                self._read_kept()
        finally:
            self._shutdown()

    def _subscribe(self) -> None:
        self.reader.subscribe(self._on_assign, self._on_revoke, self._on_lost)

    def _keep_membership(self) -> None:
        """Join the group again with a new consumer if this one seems to be out of it
        (see :mod:`celery_scheduler.dispatcher.membership`)."""
        now = time.monotonic()
        self._hand_over(self.membership.lost_to_give_up(now, self.engine.may_persist))
        strays = self.membership.strays(self.engine.leased(), now)
        if strays:
            logger.warning("partitions %s have been leased here for %.0fs while this dispatcher "
                           "neither is assigned them nor reads them: handing them over",
                           strays, self.membership.stray_seconds)
            self._hand_over(strays)
        if not self.membership.due(now):
            return
        try:
            leases = self.store.leases()
        except SchedulerError:
            return  # Cassandra is away: the leases say nothing now
        orphaned = self.membership.orphaned(leases, self.engine.clock())
        if orphaned:
            self._rejoin(orphaned, now)

    def _read_kept(self) -> None:
        """Read the partitions kept after a lost group session, until the group assigns
        again (see :mod:`celery_scheduler.dispatcher.kept`)."""
        try:
            self.kept.follow(self.membership.kept, self.ingest.written_to)
        except TaskLogError as exc:
            logger.warning("could not read the kept partitions %s (%s); trying again",
                           self.membership.kept, exc)
            self.kept.close()
            return
        self.kept.read_once(KEPT_POLL_SECONDS)

    def _rejoin(self, orphaned: list[int], now: float) -> None:
        logger.warning(
            "this dispatcher has held no partition for %.0fs while partitions %s have no owner "
            "(their leases ran out): its Kafka consumer seems to be out of the group; joining "
            "it again with a new consumer", self.membership.unassigned_for(now), orphaned)
        # the consumer it replaces holds no partition, and its callbacks reach nobody
        self._hand_over(self.membership.rejoined(now))
        self.reader.rejoin()

    def stop(self) -> None:
        self.stopping.set()

    def _shutdown(self) -> None:
        logger.info("dispatcher %s leaving the group", self.owner)
        try:
            self.reader.close()  # commits nothing new; triggers the revoke hand-over
        except TaskLogError as exc:
            logger.warning("closing the consumer: %s", exc)
        self.kept.close()
        self.engine.stop()
        try:
            self.outcomes.close()
        except TaskLogError as exc:
            logger.warning("closing the outcome reader: %s", exc)
        self.publisher.close()
        self.delivery.close()
        self.ingest.close()
        self.store.close()


def check(app: Any) -> list[str]:
    """Return the problems that would stop a dispatcher from working (empty: healthy)."""
    settings = get_settings(app)
    problems = topic_problems(settings)
    try:
        with open_store(settings) as store:
            from celery_scheduler.keys import TaskKey

            store.status(TaskKey("health-check", 0, "health-check"))
    except SchedulerError as exc:
        problems.append(f"cassandra: {exc}")
    try:  # where releases go
        with app.connection_for_write() as connection:
            connection.ensure_connection(max_retries=1, interval_start=0, timeout=3)
    except Exception as exc:  # any transport's errors: the check reports, never raises
        problems.append(f"broker: {type(exc).__name__}: {exc}")
    return problems
