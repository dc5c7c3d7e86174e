"""Profile one hot path of celery_scheduler against the real services, with pyinstrument.

::

    python benchmarks/profile.py schedule --form batched --count 20000
    python benchmarks/profile.py schedule --form many --count 30000
    python benchmarks/profile.py schedule --form sync --count 3000
    python benchmarks/profile.py ingest --count 20000
    python benchmarks/profile.py backlog --count 20000 --ordering-ids 2000

Each run creates a topic, keyspace and Celery queue of its own on the default services
(Kafka 127.0.0.1:9092, Cassandra 127.0.0.1:9042, Redis 127.0.0.1:6379; override with
``--kafka``, ``--cassandra``, ``--redis``), measures the path, prints the rate next to a raw
reference rate of the same records (a plain confluent-kafka producer for ``schedule``, plain
concurrent Cassandra inserts for ``ingest``), prints the profile, and drops what it created.

* ``schedule``: ``task.schedule(..., wait=False)`` then one flush (``batched``),
  ``task.schedule_many`` of every call at once (``many``; the calls are made before the
  clock starts), or ``schedule_at`` waiting for each acknowledgement (``sync``).
* ``ingest``: the dispatcher's ingest loop (poll, decode, check, persist, commit) over records
  a week ahead, with the release engine running beside it as in a dispatcher.
* ``backlog``: the release engine draining overdue tasks already stored in Cassandra, each
  step's releases published to Celery in one batch as a dispatcher does (``--one-by-one``:
  one ``send_task`` round trip each); a worker's completion notice is fed back to the
  engine as soon as a task is published, so the next task of its ordering id can go. Checks
  that every ordering id was released in schedule order.

``--no-profile`` measures without the profiler's overhead.
``--no-kafka`` (schedule) acknowledges each record at once without Kafka: what is left is
the Python work of the call itself.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# Run as a script, Python puts this directory first on sys.path, where this file would hide
# the standard library's ``profile`` module; look modules up from the repository instead.
REPO = Path(__file__).resolve().parent.parent
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(REPO)

try:
    from pyinstrument import Profiler
except ImportError:  # pragma: no cover - depends on the environment
    sys.exit("benchmarks/profile.py needs pyinstrument: pip install -e '.[bench]' "
             "(or pip install pyinstrument)")

from celery import Celery  # noqa: E402
from confluent_kafka import Consumer, Producer  # noqa: E402

from celery_scheduler import release as releasing  # noqa: E402
from celery_scheduler import scheduled_task, wire  # noqa: E402
from celery_scheduler.api import registered  # noqa: E402
from celery_scheduler.client import SchedulerClient, set_client  # noqa: E402
from celery_scheduler.clock import now_ms  # noqa: E402
from celery_scheduler.config import get_settings  # noqa: E402
from celery_scheduler.dispatcher.engine import Engine  # noqa: E402
from celery_scheduler.dispatcher.ingest import Ingest  # noqa: E402
from celery_scheduler.dispatcher.service import engine_settings  # noqa: E402
from celery_scheduler.dispatcher.state import PublishMany  # noqa: E402
from celery_scheduler.dispatcher.timetable import Loaded  # noqa: E402
from celery_scheduler.envelope import encode  # noqa: E402
from celery_scheduler.partitioner import partition_for  # noqa: E402
from celery_scheduler.store import open_store  # noqa: E402
from celery_scheduler.store.base import Operation, Put  # noqa: E402
from celery_scheduler.tasklog.base import Ack, Position, TaskLog  # noqa: E402
from celery_scheduler.tasklog.dead_letters import DeadLetters  # noqa: E402
from celery_scheduler.tasklog.kafka import create_topic  # noqa: E402
from celery_scheduler.tasklog.reader import KafkaTaskLogReader  # noqa: E402
from celery_scheduler.tasklog.topics import dead_letter_topic  # noqa: E402
from celery_scheduler.wire import Outcome, outcome_topic  # noqa: E402

PARTITIONS = 12


def _unique_seq(ordering_id: str, seq: int) -> str:
    return f"seq-{seq}"


def make_app(args: argparse.Namespace, name: str) -> tuple[Celery, Any]:
    """A Celery app on the services, with one scheduled task, on topic/keyspace/queue *name*."""
    app = Celery("profile", broker=f"{args.redis}/1")
    app.conf.update(
        scheduler_kafka_bootstrap_servers=args.kafka,
        scheduler_kafka_topic=name,
        scheduler_kafka_options=dict(option.split("=", 1) for option in args.kafka_option),
        scheduler_kafka_partitions=PARTITIONS,
        scheduler_cassandra_contact_points=(args.cassandra.rsplit(":", 1)[0],),
        scheduler_cassandra_port=int(args.cassandra.rsplit(":", 1)[1]),
        scheduler_cassandra_keyspace=name,
        task_default_queue=name,
        broker_connection_retry_on_startup=True,
    )

    @scheduled_task(ordering_id="ordering_id", uniqueness_key=_unique_seq)
    @app.task(name="profile.work")
    def work(ordering_id: str, seq: int) -> int:
        return seq

    return app, work


@contextlib.contextmanager
def scratch(args: argparse.Namespace) -> Iterator[tuple[Celery, Any, str]]:
    """Topic, keyspace and queue of this run; all dropped at the end."""
    name = f"profile_{uuid.uuid4().hex[:12]}"
    app, work = make_app(args, name)
    settings = get_settings(app)
    create_topic(args.kafka, {}, name, PARTITIONS, 1)
    create_topic(args.kafka, {}, dead_letter_topic(name), 1, 1)
    create_topic(args.kafka, {}, outcome_topic(name), PARTITIONS, 1)
    with open_store(settings) as store:
        store.create_schema()
    try:
        yield app, work, name
    finally:
        _drop(args, name)


def _drop(args: argparse.Namespace, name: str) -> None:
    import redis
    from cassandra.cluster import Cluster
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": args.kafka})
    for future in admin.delete_topics([name, dead_letter_topic(name), outcome_topic(name)],
                                      operation_timeout=30).values():
        with contextlib.suppress(Exception):
            future.result(30)
    host, port = args.cassandra.rsplit(":", 1)
    cluster = Cluster([host], port=int(port))
    try:
        cluster.connect().execute(f"DROP KEYSPACE IF EXISTS {name}", timeout=60)
    finally:
        cluster.shutdown()
    broker = redis.Redis.from_url(f"{args.redis}/1")
    broker.delete(name, f"_kombu.binding.{name}")


class Run:
    """Times (and optionally profiles) the measured part of a path."""

    def __init__(self, enabled: bool) -> None:
        self.profiler = Profiler(interval=0.0005) if enabled else None
        self.seconds = 0.0

    @contextlib.contextmanager
    def measure(self) -> Iterator[None]:
        if self.profiler is not None:
            self.profiler.start()
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds = time.perf_counter() - started
            if self.profiler is not None:
                self.profiler.stop()

    def report(self, what: str, count: int, reference: tuple[str, float] | None = None) -> None:
        if self.profiler is not None:
            print(self.profiler.output_text(unicode=True, color=False, short_mode=False))
        rate = count / self.seconds
        line = f"{what}: {count} in {self.seconds:.2f}s = {rate:,.0f}/s"
        if reference is not None:
            name, ref_rate = reference
            line += f"; {name}: {ref_rate:,.0f}/s; ratio {rate / ref_rate:.0%}"
        print(line, flush=True)


def _far_future() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=7)


def _producer_rate(args: argparse.Namespace, topic: str, records: list[tuple[bytes, bytes]]) -> float:
    """Raw confluent-kafka produce of *records* with the task log's durability settings."""
    producer = Producer({"bootstrap.servers": args.kafka, "acks": "all", "enable.idempotence": True,
                         "partitioner": "murmur2_random"})
    producer.produce(topic, key=b"warm-up", value=b"{}")
    producer.flush(30)
    started = time.perf_counter()
    for key, value in records:
        while True:
            try:
                producer.produce(topic, key=key, value=value)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    assert producer.flush(60) == 0
    return len(records) / (time.perf_counter() - started)


class _Taken(TaskLog):
    """A task log that takes each record and acknowledges it at once (``--no-kafka``): what
    is left of a schedule call is its own Python work (a batch's records go one by one)."""

    def publish_async(self, key: str, value: bytes, headers: dict[str, bytes] | None = None
                      ) -> Ack:
        return Ack.of(Position(0, 0))

    def flush(self, timeout: float | None = None) -> int:
        return 0

    def partitions(self) -> int:
        return 12


def profile_schedule(args: argparse.Namespace) -> None:
    with scratch(args) as (app, work, name):
        client = SchedulerClient(get_settings(app), task_log=_Taken() if args.no_kafka else None)
        set_client(app, client)
        when = _far_future()
        work.schedule(("warm-up", -1), at=when)  # connect and read metadata first
        calls = [(when, (f"o{i % args.ordering_ids}", i)) for i in range(args.count)]
        if args.form == "many":
            work.schedule_many(calls[:1000])  # its producer connects on the first batch
        run = Run(not args.no_profile)
        with run.measure():
            if args.form == "many":
                work.schedule_many(calls)
            elif args.form == "batched":
                for i in range(args.count):
                    work.schedule((f"o{i % args.ordering_ids}", i), at=when, wait=False)
                assert client.flush(60) == 0
            else:
                for i in range(args.count):
                    work.schedule_at(when, f"o{i % args.ordering_ids}", i)
        envelopes = [work.build((f"o{i % args.ordering_ids}", i), {}, at=when)
                     for i in range(args.count)]
        records = [(e.key.ordering_id.encode(), encode(e)) for e in envelopes]
        client.close()
        reference = ("raw confluent-kafka produce, same records", _producer_rate(args, name, records))
        run.report(f"schedule ({args.form})", args.count, reference)


def _raw_insert_rate(store: Any, rows: list[tuple[Any, ...]]) -> float:
    """Plain concurrent inserts of the same schedule rows, one request each."""
    from cassandra.concurrent import execute_concurrent_with_args

    statement = store._session.prepare(
        f"INSERT INTO {store.keyspace}.schedule (partition, bucket, at, ordering_id, unique_key, task,"
        " envelope) VALUES (?, ?, ?, ?, ?, ?, ?)")
    started = time.perf_counter()
    execute_concurrent_with_args(store._session, statement, rows, concurrency=64,
                                 raise_on_first_error=True)
    return len(rows) / (time.perf_counter() - started)


def _dispatcher_parts(app: Celery, name: str, publish: Callable[[Loaded, wire.Release], None],
                      publish_many: PublishMany | None = None
                      ) -> tuple[Any, Engine, Consumer, Ingest]:
    settings = get_settings(app)
    store = open_store(settings)
    engine = Engine(store, publish, f"profile-{uuid.uuid4().hex[:8]}", engine_settings(settings),
                    publish_many=publish_many)
    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                         "group.id": f"{name}.dispatchers", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest",
                         "partition.assignment.strategy": "cooperative-sticky"})
    dead = DeadLetters(Producer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                                 "acks": "all", "enable.idempotence": True}),
                       dead_letter_topic(name))
    names = set(registered())
    ingest = Ingest(KafkaTaskLogReader(name, lambda: consumer), store, engine, dead, lambda: PARTITIONS,
                    allowed=names.__contains__)
    return store, engine, consumer, ingest


def profile_ingest(args: argparse.Namespace) -> None:
    with scratch(args) as (app, work, name):
        when = _far_future()
        envelopes = [work.build((f"o{i % args.ordering_ids}", i), {}, at=when)
                     for i in range(args.count)]
        producer = Producer({"bootstrap.servers": args.kafka, "acks": "all",
                             "enable.idempotence": True, "partitioner": "murmur2_random"})
        for envelope in envelopes:
            producer.produce(name, key=envelope.key.ordering_id.encode(), value=encode(envelope))
            producer.poll(0)
        assert producer.flush(60) == 0

        store, engine, consumer, ingest = _dispatcher_parts(app, name, lambda task, release: None)
        consumer.subscribe([name], on_assign=lambda c, ps: engine.assign(p.partition for p in ps))
        engine.start()
        while not engine.partitions:  # joined the group
            ingest.poll_once(0.2)
        run = Run(not args.no_profile)
        with run.measure():
            deadline = time.monotonic() + 600
            while ingest.persisted_count < args.count and time.monotonic() < deadline:
                ingest.poll_once(0.2)
        persisted = ingest.persisted_count
        consumer.close()
        engine.stop()
        rows = [(partition_for(e.key.ordering_id, PARTITIONS), 0, e.key.scheduled_at.replace(tzinfo=None),
                 e.key.ordering_id, f"raw-{e.key.uniqueness_key}", e.task, encode(e))
                for e in envelopes]
        reference = ("raw concurrent Cassandra inserts, same rows", _raw_insert_rate(store, rows))
        store.close()
        run.report("ingest (persisted and committed)", persisted, reference)
        if persisted < args.count:
            sys.exit(f"only {persisted} of {args.count} records were persisted within 10 minutes")


def profile_backlog(args: argparse.Namespace) -> None:
    with scratch(args) as (app, work, name):
        settings = get_settings(app)
        overdue = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=30)
        current = now_ms()
        with open_store(settings) as loading:
            chunk = 2000
            for start in range(0, args.count, chunk):
                operations: list[Operation] = []
                for i in range(start, min(args.count, start + chunk)):
                    # tasks of one ordering id one millisecond apart, in seq order
                    envelope = work.build((f"o{i % args.ordering_ids}", i), {},
                                          at=overdue + dt.timedelta(milliseconds=i // args.ordering_ids))
                    operations.append(Put(partition_for(envelope.key.ordering_id, PARTITIONS), envelope))
                loading.apply(operations, current)
        print(f"stored {args.count} overdue tasks over {args.ordering_ids} ordering ids", flush=True)

        last_seq: dict[str, int] = {}
        disorder: list[str] = []

        publisher = releasing.Publisher(app)  # as a dispatcher keeps one

        def sent(task: Loaded, release: wire.Release) -> None:
            ordering_id, seq = task.envelope.args
            if last_seq.get(ordering_id, -1) >= seq:
                disorder.append(f"{ordering_id}: {seq} after {last_seq[ordering_id]}")
            last_seq[ordering_id] = seq
            # what a worker's completion notice would tell the engine
            engine.outcome(Outcome(task.key, task.partition, release.attempt, True, None))

        def publish(task: Loaded, release: wire.Release) -> None:
            publisher.publish(task.envelope, release)
            sent(task, release)

        def publish_many(items: list[tuple[Loaded, wire.Release]]) -> list[Exception | None]:
            results = publisher.publish_many([(task.envelope, release) for task, release in items])
            for (task, release), error in zip(items, results, strict=True):
                if error is None:
                    sent(task, release)
            return results

        store, engine, _, _ = _dispatcher_parts(app, name, publish,
                                                None if args.one_by_one else publish_many)
        engine.assign(range(PARTITIONS))
        with app.connection_for_write() as connection:
            connection.ensure_connection()
        run = Run(not args.no_profile)
        with run.measure():
            deadline = time.monotonic() + 600
            while engine.completed_count < args.count and time.monotonic() < deadline:
                engine.step()
        completed = engine.completed_count
        publisher.close()
        engine.stop()
        store.close()
        run.report("backlog drained (released and completed)", completed)
        if completed < args.count or disorder:
            sys.exit(f"{completed} of {args.count} completed; out of order: {disorder[:5]}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", choices=["schedule", "ingest", "backlog"])
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--ordering-ids", type=int, default=1000)
    parser.add_argument("--form", choices=["batched", "many", "sync"], default="batched",
                        help="schedule path: wait=False calls and one flush, schedule_many, or "
                             "one ack per call")
    parser.add_argument("--no-profile", action="store_true", help="measure without pyinstrument")
    parser.add_argument("--no-kafka", action="store_true",
                        help="schedule: acknowledge each record at once, without Kafka")
    parser.add_argument("--one-by-one", action="store_true",
                        help="backlog path: publish each release on its own, not a step's in one batch")
    parser.add_argument("--kafka-option", action="append", default=[], metavar="NAME=VALUE",
                        help="librdkafka setting for the schedule calls' producer, e.g. linger.ms=5")
    parser.add_argument("--kafka", default="127.0.0.1:9092")
    parser.add_argument("--cassandra", default="127.0.0.1:9042")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379")
    args = parser.parse_args(argv)
    {"schedule": profile_schedule, "ingest": profile_ingest, "backlog": profile_backlog}[args.path](args)
    # librdkafka and cassandra-driver threads may linger; the measurements are printed
    threading.Event().wait(0.1)


if __name__ == "__main__":
    main()
