"""Scenario 4: memory with many tasks pending far ahead.

celery_scheduler: the schedule is filled straight in Cassandra (``benchmarks.populate``),
then a dispatcher is started over it and its resident memory sampled. The tasks are not in
the dispatcher but in Cassandra and Kafka: Cassandra's bytes on disk for them (after a
flush) and its memory, and the Kafka log bytes of a schedule record, are measured beside it
(``benchmarks.storage``). Celery's ``eta=``:
a worker receives every ETA task at once and keeps it in memory until it is due; its
resident memory is measured before and after it received them, and the growth per task
extrapolated linearly to the dispatcher's task count.
"""

from __future__ import annotations

import random
import time

import psutil
import redis

from benchmarks import storage
from benchmarks.context import Context, utc
from benchmarks.harness import REDIS_URL, Stack, stack
from benchmarks.populate import populate
from benchmarks.report import Section
from benchmarks.stats import Figure, ratio

__all__ = ["rss_mb", "run"]

WEEK = 7 * 86_400
ORDERING_IDS = 10_000
TARGET_PENDING = 1_000_000


def rss_mb(pid: int) -> float:
    """Resident memory of a process and its children, MB."""
    process = psutil.Process(pid)
    rss: int = sum(p.memory_info().rss for p in [process, *process.children(recursive=True)])
    return rss / 2**20


def _sample(pid: int, seconds: float) -> float:
    peak = 0.0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        peak = max(peak, rss_mb(pid))
        time.sleep(0.25)
    return peak


def _dispatcher_rss(s: Stack, settle: float, window: float) -> float:
    dispatcher = s.dispatcher()
    time.sleep(settle)
    peak = _sample(dispatcher.pid, window)
    s.check_alive()
    s.stop(dispatcher)
    return peak


def _kafka_bytes_per_record(s: Stack, app: object, records: int) -> float:
    """Schedule *records* calls through the package (due in a week, so they stay pending);
    the topic's log bytes (one replica) per record."""
    from celery_scheduler import flush

    before = storage.kafka_log_bytes(s.name)
    at = time.time() + WEEK
    for i in range(records):
        app.record.schedule((f"k{i % ORDERING_IDS}", i, at + i), {},  # type: ignore[attr-defined]
                            at=utc(at + i), wait=False)
    if flush(app.app, 60):  # type: ignore[attr-defined]
        raise RuntimeError("schedule records left unacknowledged")
    return (storage.kafka_log_bytes(s.name) - before) / records


def run(ctx: Context) -> list[Section]:
    pending = ctx.pick(8_000, TARGET_PENDING)
    held = ctx.pick(2_000, 100_000)
    fill_seconds = ctx.pick(4, 600)  # the machine is shared: stop filling after this long
    runs = ctx.pick(2, 3)
    settle, window = ctx.pick(2, 10), ctx.pick(2, 10)
    section = Section("4", "Memory with tasks pending over the next 7 days")
    ours: list[float] = []
    records = ctx.pick(2_000, 20_000)
    with stack(ctx.tmp) as s:
        app = s.use_client()
        node_before = storage.cassandra_info()
        start = time.time() + 300
        due = random.Random(4).random  # uniform over the week, whichever prefix gets written
        pending, rate = populate(s, app, ((f"o{i % ORDERING_IDS}", i, start + due() * WEEK)
                                          for i in range(pending)), fill_seconds)
        storage.cassandra_flush(s.name)
        disk_per_task = storage.keyspace_disk_bytes(s.name) / pending
        node_after = storage.cassandra_info()
        kafka_per_record = _kafka_bytes_per_record(s, app, records)
        ours = [_dispatcher_rss(s, settle, window) for _ in range(runs)]
    with stack(ctx.tmp, init=False) as s:
        app = s.use_client()
        worker = s.worker()
        time.sleep(2)
        baseline = _sample(worker.pid, 2)
        broker = redis.Redis.from_url(REDIS_URL)
        start = time.time() + 300
        published = time.monotonic()
        for i in range(held):
            if i % 1000 == 0 and time.monotonic() - published > fill_seconds:
                held = i
                break
            at = start + i * WEEK / held
            app.plain.apply_async((f"o{i % ORDERING_IDS}", i, at), eta=utc(at), queue=s.name)
        published = time.monotonic() - published
        deadline = time.monotonic() + 600
        while broker.llen(s.name) > 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not receive the ETA tasks: {broker.llen(s.name)} left")
            s.check_alive()
            time.sleep(0.5)
        time.sleep(3)
        holding = _sample(worker.pid, window)
    per_task_kb = (holding - baseline) * 1024 / held
    extrapolated = baseline + per_task_kb * TARGET_PENDING / 1024
    limit = 200
    short = pending < TARGET_PENDING
    row = section.add(f"dispatcher RSS, {pending:,} tasks pending", Figure.of(ours, "MB"),
                      f"≤ {limit} MB with {TARGET_PENDING:,} pending", Figure.of(ours).median <= limit)
    if short:
        row.note = f"at {pending:,} pending; {TARGET_PENDING:,} not reached"
    section.add("Celery worker RSS idle", Figure.of([baseline], "MB"))
    section.add(f"Celery worker RSS holding {held:,} ETA tasks", Figure.of([holding], "MB"))
    section.add("Celery worker memory per ETA task", Figure.of([per_task_kb], "KB", 1))
    section.add(f"Celery worker RSS for {TARGET_PENDING:,} ETA tasks (extrapolated)",
                Figure.of([extrapolated], "MB"))
    section.add(f"dispatcher RSS / Celery worker RSS, {TARGET_PENDING:,} pending (extrapolated)",
                Figure.of([ratio(rss, extrapolated) for rss in ours], "%", 1))
    section.add("Cassandra: bytes on disk a pending task (one replica, after a flush)",
                Figure.of([disk_per_task], "B"))
    section.add(f"Cassandra: on disk for {TARGET_PENDING:,} pending, one replica (from the row "
                "above)", Figure.of([disk_per_task * TARGET_PENDING / 2**20], "MB"))
    section.add("Cassandra: heap in use before the fill (the node's whole heap, GC-dependent)",
                Figure.of([node_before["heap_mb"]], "MB"))
    section.add("Cassandra: heap in use after the fill and a flush",
                Figure.of([node_after["heap_mb"]], "MB"))
    section.add("Cassandra: off-heap memory after the fill (bloom filters, index summaries)",
                Figure.of([node_after["off_heap_mb"]], "MB", 1))
    section.add("Kafka: log bytes a schedule record (one replica, kept for the topic's "
                "retention)", Figure.of([kafka_per_record], "B"))
    section.add("schedule filled at (direct Cassandra batches)", Figure.of([rate], "tasks/s"))
    section.add(f"Celery apply_async publish of {held:,} ETA tasks", Figure.of([held / published], "/s"))
    section.method = [
        f"celery_scheduler: {pending:,} tasks, due at uniformly random times from 5 minutes to 7 "
        "days ahead, "
        f"{ORDERING_IDS:,} ordering ids, 12 partitions, written straight into the scheduler's "
        "Cassandra tables (the store's rows: schedule, pending status, bucket index) in unlogged "
        "batches, because ingest through Kafka is far slower than needed for this count on this "
        "machine (scenario 2). Then a dispatcher is started, and its RSS (with any children) "
        f"sampled every 0.25 s for {window} s after it leased its partitions and {settle} s more; "
        f"the figure is the peak; {runs} dispatcher start(s) over the same schedule.",
        "where the tasks are: Cassandra's bytes on disk are the keyspace's SSTables after "
        "`nodetool flush` (one node: multiply by the replication factor), divided by the tasks "
        "written; its heap and off-heap memory come from `nodetool info` before and after the "
        "fill (the heap is the whole node's and moves with garbage collection: it is shown, not "
        f"divided). Kafka: {records:,} schedule calls made through the package (due a week "
        "ahead, so the dispatcher then loads them with the rest), the topic's log segment bytes "
        "on the broker's disk divided by them; Kafka keeps them for the topic's retention, "
        "whether they are pending or done.",
        f"Celery eta=: one --pool=solo worker on the Redis broker; RSS sampled idle, then {held:,} "
        "tasks are published with eta spread over 7 days; once the queue is empty (the worker holds "
        "them all) and 3 s more, RSS is sampled again. Per task = growth / tasks; the extrapolation "
        f"is idle RSS + per-task growth x {TARGET_PENDING:,}. One run (a worker holding the "
        "tasks cannot be restarted cleanly within the time budget).",
    ]
    if pending < TARGET_PENDING:
        section.method.append(f"{pending:,} pending tasks, not {TARGET_PENDING:,}: filling stops after "
                              f"{fill_seconds} s (as does publishing the ETA tasks), to keep the run's "
                              "time bounded on this shared machine.")
    return [section]
