"""The app the chaos harness runs: one scheduled task that logs each execution.

Everything comes from the environment the harness sets, so dispatchers and workers talk to
the harness's own Kafka, Cassandra and broker (which it restarts at will):

- ``CELERY_SCHEDULER_CHAOS_KAFKA``, ``CELERY_SCHEDULER_CHAOS_CASSANDRA_PORT``,
  ``CELERY_SCHEDULER_CHAOS_BROKER`` (a Redis or RabbitMQ URL): where the services are;
- ``CELERY_SCHEDULER_CHAOS_CLUSTER=1`` with ``CELERY_SCHEDULER_CHAOS_CASSANDRA_HOSTS``: three
  Kafka brokers and three Cassandra nodes, replicated three ways, written at LOCAL_QUORUM
  with lightweight transactions at LOCAL_SERIAL, as docs/production.md recommends;
- ``CELERY_SCHEDULER_TEST_TOPIC``/``_KEYSPACE``/``_QUEUE``/``_EXECLOG``: as for
  ``tests.apps.dispatching``, so ``tests.integration.dispatch_fixtures.Scheduler`` drives it;
- ``CELERY_SCHEDULER_CHAOS_MUTANT``: a deliberately broken dispatcher (one of :data:`MUTANTS`),
  to show that the harness notices when a guarantee is broken: each breaks one;
- ``CELERY_SCHEDULER_CHAOS_PERIODIC`` (``name=seconds/overlap/slow_run,...``): periodic
  entries of ``chaos.tick`` the dispatchers fire, each run logged under the ordering id
  ``periodic:<name>`` with its task id, which names the occurrence.

The leases are the package's defaults unless ``CELERY_SCHEDULER_TEST_LEASE`` (the run lease)
or ``CELERY_SCHEDULER_TEST_START_LEASE`` say otherwise, and so is how far ahead occurrences
are written unless ``CELERY_SCHEDULER_CHAOS_PERIODIC_AHEAD`` does. Each execution appends a
``start`` and an ``end`` line (JSON) to the execution log, with the release's partition,
lease epoch, attempt, start lease's end and when it was marked, from the message header.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

from celery import Celery
from confluent_kafka import KafkaException, TopicPartition

from celery_scheduler import periodic_tasks, scheduled_task
from celery_scheduler.tasklog.base import Record
from celery_scheduler.wire import HEADER, parse_header
from tests.apps.dispatching import log, unique_seq

BROKER_URL = os.environ.get("CELERY_SCHEDULER_CHAOS_BROKER", "redis://127.0.0.1:16379/1")
# The broken dispatchers, each with the verdict it must make fail.
MUTANTS = {
    # Kafka offsets committed before the batch is written to Cassandra
    "commit-before-persist": "lost",
    # cancel records read and dropped
    "ignore-cancels": "cancelled_but_ran",
    # every task taken as due three seconds early
    "release-early": "early",
    # the next task of an ordering id released while the one before is in flight
    "release-two-at-once": "overlaps",
    # the latest task of an ordering id released first
    "release-out-of-order": "order_violations",
    # a dispatcher taking a partition over fires none of the occurrences missed meanwhile
    "skip-missed-occurrences": "periodic_missed",
    # each occurrence fired under a key of its own making, not the occurrence's (of the
    # entries without an overlap policy)
    "periodic-made-up-keys": "periodic_strays",
    # every occurrence written, whatever the entry's overlap policy
    "overlap-ignored": "periodic_overlap_broken",
    # an entry with an overlap policy fired once, then skipped as if its run never ended
    "overlap-skips-all": "periodic_skipped_wrongly",
    # an allow_all entry's occurrences under the entry's one ordering id: each waits
    "allow-all-serial": "periodic_allow_all_waited",
    # the operators' pauses read and ignored: what they pause is released all the same
    "ignore-pauses": "released_while_paused",
    # reschedule records read and dropped: a moved key runs at its old time
    "ignore-reschedules": "rescheduled_ran_at_old_time",
    # a reschedule puts the new key and leaves the old one pending: both run
    "reschedule-keeps-old": "rescheduled_ran_twice",
}
MUTANT_COMMIT_FIRST = "commit-before-persist"

app = Celery("chaos", broker=BROKER_URL)
app.conf.update(
    scheduler_kafka_bootstrap_servers=os.environ.get("CELERY_SCHEDULER_CHAOS_KAFKA", "127.0.0.1:19092"),
    scheduler_kafka_topic=os.environ.get("CELERY_SCHEDULER_TEST_TOPIC", "celery_scheduler_chaos"),
    scheduler_kafka_partitions=int(os.environ.get("CELERY_SCHEDULER_TEST_PARTITIONS", "6")),
    scheduler_kafka_produce_timeout=5.0,
    scheduler_cassandra_port=int(os.environ.get("CELERY_SCHEDULER_CHAOS_CASSANDRA_PORT", "19042")),
    scheduler_cassandra_keyspace=os.environ.get("CELERY_SCHEDULER_TEST_KEYSPACE", "celery_scheduler_chaos"),
    scheduler_cassandra_consistency="ONE",
    scheduler_cassandra_serial_consistency="SERIAL",
    scheduler_cassandra_contact_points=tuple(
        os.environ.get("CELERY_SCHEDULER_CHAOS_CASSANDRA_HOSTS", "127.0.0.1").split(",")),
    scheduler_cassandra_request_timeout=5.0,
    scheduler_partition_lease_seconds=float(os.environ.get("CELERY_SCHEDULER_TEST_PARTITION_LEASE", "6")),
    scheduler_retry_backoff=0.2,
    scheduler_retry_backoff_max=1.0,
    scheduler_max_attempts=int(os.environ.get("CELERY_SCHEDULER_CHAOS_ATTEMPTS", "100")),
    task_default_queue=os.environ.get("CELERY_SCHEDULER_TEST_QUEUE", "chaos"),
    broker_connection_retry_on_startup=True,
    broker_connection_max_retries=None,
    worker_hijack_root_logger=False,
    worker_prefetch_multiplier=1,
    # on RabbitMQ, a message is taken off the queue only once its run ended (README: Brokers)
    task_acks_late=BROKER_URL.startswith("amqp"),
)
if os.environ.get("CELERY_SCHEDULER_CHAOS_CLUSTER") == "1":
    app.conf.update(
        scheduler_kafka_replication_factor=3,  # and min.insync.replicas 2 (init sets it)
        scheduler_cassandra_replication={"class": "NetworkTopologyStrategy", "datacenter1": 3},
        scheduler_cassandra_consistency="LOCAL_QUORUM",
        scheduler_cassandra_serial_consistency="LOCAL_SERIAL",
    )
for variable, setting in (("CELERY_SCHEDULER_TEST_LEASE", "scheduler_lease_seconds"),
                          ("CELERY_SCHEDULER_TEST_START_LEASE", "scheduler_start_lease_seconds"),
                          ("CELERY_SCHEDULER_CHAOS_PERIODIC_AHEAD", "scheduler_periodic_ahead_seconds")):
    if os.environ.get(variable):
        app.conf[setting] = float(os.environ[variable])


@scheduled_task(ordering_id="ordering_id", uniqueness_key=unique_seq)
@app.task(name="chaos.record", bind=True)
def record(self: Any, ordering_id: str, seq: int, duration: float = 0.0,
           scheduled_for: float = 0.0) -> int:
    release = parse_header(getattr(self.request, HEADER, None))
    where = {} if release is None else {"p": release.partition, "e": release.epoch,
                                        "a": release.attempt, "l": release.lease_until_ms,
                                        "m": release.marked_ms}
    log("start", ordering_id, seq, scheduled_for=scheduled_for, **where)
    if duration:
        time.sleep(duration)
    log("end", ordering_id, seq)
    return seq


# Periodic entries (CELERY_SCHEDULER_CHAOS_PERIODIC, "name=seconds/overlap/slow_run,..."),
# each an interval entry of chaos.tick, fired by the dispatchers, with its overlap policy. An
# entry with a slow_run runs every third occurrence (by its time) that long, the others
# 0.2 s, on a queue of its own (SLOW_QUEUE), so that its runs keep no other task waiting.
PERIODIC = {name: spec.split("/") for name, spec in
            (item.split("=") for item in os.environ.get("CELERY_SCHEDULER_CHAOS_PERIODIC", "").split(",")
             if item)}
SLOW_QUEUE = f"{app.conf.task_default_queue}-slow"


@app.task(name="chaos.tick", bind=True)
def tick(self: Any, name: str, every: float = 0.0, slow_run: float = 0.0) -> None:
    release = parse_header(getattr(self.request, HEADER, None))
    # under the ordering id of its key (an allow_all occurrence's own), and its time
    ordering_id = f"periodic:{name}" if release is None else release.key.ordering_id
    where = {} if release is None else {"p": release.partition, "a": release.attempt,
                                        "at": release.key.scheduled_ms / 1000}
    log("start", ordering_id, 0, task_id=self.request.id, **where)
    if slow_run and release is not None:
        time.sleep(slow_run if release.key.scheduled_ms // int(every * 1000) % 3 == 0 else 0.2)
    log("end", ordering_id, 0)


if PERIODIC:
    app.conf.scheduler_periodic = True
    app.conf.beat_schedule = {
        name: {"task": "chaos.tick", "schedule": float(every), "overlap": overlap,
               "args": [name, float(every), float(slow_run)],
               "options": {"queue": SLOW_QUEUE} if float(slow_run) else {}}
        for name, (every, overlap, slow_run) in PERIODIC.items()}
    periodic_tasks.install(app)


class _CommitFirst:
    """A task log reader that commits each batch as soon as it has read it (the mutant)."""

    def __init__(self, reader: Any) -> None:
        self._consumer = reader

    def consume(self, *args: Any, **kwargs: Any) -> Any:
        read = self._consumer.consume(*args, **kwargs)
        past = {r.partition: r.offset + 1 for r in read if isinstance(r, Record)}
        if past:
            offsets = [TopicPartition(self._consumer.topic, partition, offset)
                       for partition, offset in past.items()]
            # on the Kafka consumer behind the reader port, so the commit is done when it returns
            with contextlib.suppress(KafkaException):  # revoked meanwhile
                self._consumer.consumer.commit(offsets=offsets, asynchronous=False)
            time.sleep(1.0)  # a slow Cassandra write after the commit: a kill lands here
        return read

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


def _commit_first() -> None:
    """Break the dispatcher's ingest: Kafka offsets are committed BEFORE the Cassandra write."""
    from celery_scheduler.dispatcher.ingest import Ingest

    init = Ingest.__init__

    def wrapped_init(self: Ingest, consumer: Any, *args: Any, **kwargs: Any) -> None:
        init(self, _CommitFirst(consumer), *args, **kwargs)

    Ingest.__init__ = wrapped_init  # type: ignore[method-assign]


def _ignore_cancels() -> None:
    """Break ingest: cancel records are read, and dropped."""
    from celery_scheduler.dispatcher.ingest import Ingest
    from celery_scheduler.store.base import Cancel

    apply = Ingest.apply

    def without_cancels(self: Ingest, operations: list[Any]) -> None:
        apply(self, [op for op in operations if not isinstance(op, Cancel)])

    Ingest.apply = without_cancels  # type: ignore[method-assign]


def _release_early() -> None:
    """Break the timetable: every task is due three seconds before its time."""
    from celery_scheduler.dispatcher.timetable import Loaded

    due = Loaded.due_ms.fget
    assert due is not None
    Loaded.due_ms = property(lambda self: due(self) - 3000)  # type: ignore[method-assign,assignment]


def _release_two_at_once() -> None:
    """Break the timetable: with each task it takes for release, the next of its ordering id."""
    from celery_scheduler.dispatcher.timetable import Timetable

    take_due = Timetable.take_due

    def take_two(self: Any, now_ms: int, limit: int | None = None, ahead_ms: int = 0) -> Any:
        taken = take_due(self, now_ms, limit, ahead_ms)
        extra = []
        for task in taken:
            queue = self._queues[task.key.ordering_id]
            following = next((t for _, t in queue.tasks
                              if t is not task and not t.awaiting_outcome), None)
            if following is not None:
                extra.append(following)
        return taken + extra

    Timetable.take_due = take_two  # type: ignore[method-assign]


def _release_out_of_order() -> None:
    """Break the timetable: an ordering id's latest task is its head."""
    from celery_scheduler.dispatcher import timetable

    timetable._Queue.head = lambda self: self.tasks[-1][1] if self.tasks else None  # type: ignore[method-assign]


def _skip_missed_occurrences() -> None:
    from celery_scheduler.dispatcher import firing

    firing.missed = lambda *args, **kwargs: []  # type: ignore[assignment]


def _periodic_made_up_keys() -> None:
    import uuid

    from celery_scheduler import periodic
    from celery_scheduler.keys import TaskKey

    occurrence_key = periodic.key

    def made_up(entry: Any, occurrence_ms: int, partition_of: Any = None) -> TaskKey:
        key = occurrence_key(entry, occurrence_ms, partition_of)
        if entry.overlap is not periodic.Overlap.BUFFER_ALL:
            return key  # left to the overlap mutants, which share its run
        return TaskKey(key.ordering_id, key.scheduled_ms, f"{key.uniqueness_key}-{uuid.uuid4().hex[:6]}")

    periodic.key = made_up  # type: ignore[assignment]


def _overlap_ignored() -> None:
    from celery_scheduler.dispatcher.firer import Firer

    Firer._kept_by_overlap = lambda self, due: list(due)  # type: ignore[method-assign]


def _overlap_skips_all() -> None:
    from celery_scheduler.dispatcher.firer import Firer

    def skips(self: Firer, due: list[Any]) -> list[Any]:
        return [o for o in due if not o.entry.overlap.looks_back or o.entry.name not in self._written]

    Firer._kept_by_overlap = skips  # type: ignore[method-assign]


def _allow_all_serial() -> None:
    from celery_scheduler import periodic

    periodic.ordering_id_of = lambda entry, occurrence_ms, partition_of: entry.ordering_id  # type: ignore[assignment]


def _ignore_pauses() -> None:
    from celery_scheduler.dispatcher import pausing

    def refresh(self: pausing.PauseWatch, now_ms: int) -> bool:
        changed = self.held != pausing.NOTHING
        self.held = pausing.NOTHING
        return changed

    pausing.PauseWatch.refresh = refresh  # type: ignore[method-assign]


def _ignore_reschedules() -> None:
    from celery_scheduler.store import lifecycle

    lifecycle.rescheduled = lambda *args, **kwargs: None  # type: ignore[assignment]


def _reschedule_keeps_old() -> None:
    from celery_scheduler.store import lifecycle

    moved = lifecycle.rescheduled

    def keeps_old(*args: Any, **kwargs: Any) -> Any:
        planned = moved(*args, **kwargs)
        return None if planned is None else (None, planned[1])

    lifecycle.rescheduled = keeps_old  # type: ignore[assignment]


_BREAK = {"commit-before-persist": _commit_first, "ignore-cancels": _ignore_cancels,
          "release-early": _release_early, "release-two-at-once": _release_two_at_once,
          "release-out-of-order": _release_out_of_order,
          "skip-missed-occurrences": _skip_missed_occurrences,
          "periodic-made-up-keys": _periodic_made_up_keys,
          "overlap-ignored": _overlap_ignored, "overlap-skips-all": _overlap_skips_all,
          "allow-all-serial": _allow_all_serial, "ignore-pauses": _ignore_pauses,
          "ignore-reschedules": _ignore_reschedules, "reschedule-keeps-old": _reschedule_keeps_old}
# Patched in this module, which only harness processes import; the package is untouched.
# Several mutants, comma-separated, break the dispatcher in each of their ways.
for _mutant in os.environ.get("CELERY_SCHEDULER_CHAOS_MUTANT", "").split(","):
    if _mutant in _BREAK:
        _BREAK[_mutant]()
