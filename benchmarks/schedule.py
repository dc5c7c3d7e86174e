"""Scenarios 1 and 1b: how fast one Python process schedules, against the raw clients.

1: the batched forms, ``schedule_many(calls)`` and ``schedule(..., wait=False)`` then
``flush(app)``, against plain confluent-kafka produce of records of the same size, keys and
producer settings.
1b: the synchronous ``schedule_at`` (returns after Kafka's ack) against Celery's
``apply_async(eta=...)`` and plain ``send_task`` on the Redis broker.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from typing import Any

import orjson
import redis
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from benchmarks.context import Context, utc
from benchmarks.harness import KAFKA, REDIS_URL, clean_redis, stack
from benchmarks.report import Section
from benchmarks.stats import Figure, percentile, ratio

__all__ = ["ORDERING_IDS", "batched_rate", "due_times", "many_rate", "run"]

ORDERING_IDS = 1000
# Calls are due at times spread over this many seconds, one distinct time (a datetime object of
# its own) a call, as an application's calls are: one time shared by every call would let the
# package convert it once a batch.
SPREAD_SECONDS = 86_400


def due_times(at: float, count: int) -> list[dt.datetime]:
    """*count* distinct due times from *at* on, a datetime each, made before any clock starts."""
    return [utc(at + (i % SPREAD_SECONDS) + i / 1_000_000) for i in range(count)]


def _raw_producer() -> Producer:
    # The settings the package's producer documents: Kafka's Java partitioner, acks=all,
    # idempotence, linger 5 ms.
    return Producer({"bootstrap.servers": KAFKA, "partitioner": "murmur2_random", "acks": "all",
                     "enable.idempotence": True, "linger.ms": 5})


def _produce_all(producer: Producer, topic: str, records: Iterator[tuple[bytes, bytes]], what: str
                 ) -> float:
    """Produce *records* (key, value), made as they are taken, then flush; records a second."""
    errors: list[Any] = []

    def delivered(error: Any, _: Any) -> None:
        if error is not None:
            errors.append(error)

    count = 0
    started = time.perf_counter()
    for key, value in records:
        while True:
            try:
                producer.produce(topic, key=key, value=value, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
        count += 1
    remaining = producer.flush(60)
    elapsed = time.perf_counter() - started
    if remaining or errors:
        raise RuntimeError(f"{what}: {remaining} unacknowledged, errors {errors[:3]}")
    return count / elapsed


def _raw_produce(producer: Producer, topic: str, records: list[tuple[bytes, bytes]]) -> float:
    """The strongest simple raw code: records (key, value) encoded before the clock starts,
    each the bytes of one of the run's schedule calls, produced back to back."""
    return _produce_all(producer, topic, iter(records), "raw produce")


def _encoded(app: Any, client: Any, times: list[dt.datetime]) -> list[tuple[bytes, bytes]]:
    """The records the run's schedule calls produce: the same keys and bytes, one a call."""
    records = []
    for i, when in enumerate(times):
        ordering_id = f"o{i % ORDERING_IDS}"
        envelope = app.record.build((ordering_id, i, when.timestamp()), {}, at=when)
        records.append((envelope.key.ordering_id.encode(), client.encode(envelope)))
    return records


def _floor_produce(producer: Producer, topic: str, document: dict[str, Any],
                   times: list[dt.datetime]) -> float:
    """The least a Python schedule call does: build the record's document, encode it, produce it.

    No argument checks, no envelope object, no futures: a dict like the envelope's JSON with
    this call's arguments and key, orjson as the package uses it, one produce with a delivery
    callback. Its rate is a ceiling for any client that encodes each call in Python.
    """
    def records() -> Iterator[tuple[bytes, bytes]]:
        for i, when in enumerate(times):
            ordering_id = f"o{i % ORDERING_IDS}"
            at_ms = int(when.timestamp() * 1000)
            yield ordering_id.encode(), orjson.dumps(
                {**document, "args": [ordering_id, i, at_ms],
                 "key": {"ordering_id": ordering_id, "at": at_ms, "unique": f"s{i}"}},
                option=orjson.OPT_SORT_KEYS)

    return _produce_all(producer, topic, records(), "floor produce")


def batched_rate(app: Any, times: list[dt.datetime]) -> float:
    """``schedule(..., wait=False)`` of a call at each of *times*, then ``flush``."""
    from celery_scheduler import flush

    count = len(times)
    started = time.perf_counter()
    for i, when in enumerate(times):
        app.record.schedule((f"o{i % ORDERING_IDS}", i, when.timestamp()), {}, at=when,
                            wait=False)
    remaining = flush(app.app, 60)
    elapsed = time.perf_counter() - started
    if remaining:
        raise RuntimeError(f"flush left {remaining} records unacknowledged")
    return count / elapsed


def many_rate(app: Any, times: list[dt.datetime]) -> float:
    """``schedule_many`` of a call at each of *times* (the calls made before the clock starts),
    until every ack."""
    count = len(times)
    calls = [(when, (f"o{i % ORDERING_IDS}", i, when.timestamp())) for i, when in enumerate(times)]
    started = time.perf_counter()
    batch = app.record.schedule_many(calls)
    elapsed = time.perf_counter() - started
    if batch.count != count:
        raise RuntimeError(f"schedule_many scheduled {batch.count} of {count} calls")
    return count / elapsed


def _timed_calls(call: Any, seconds: float) -> list[float]:
    """Call ``call(i)`` back to back for *seconds*; return each call's latency."""
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    i = 0
    while True:
        started = time.perf_counter()
        if started >= deadline:
            return latencies
        call(i)
        latencies.append(time.perf_counter() - started)
        i += 1


def run(ctx: Context) -> list[Section]:
    batched_count = ctx.pick(3_000, 30_000)
    seconds = ctx.pick(1, 4)
    one = Section("1", "Schedule rate from one process, batched")
    sync = Section("1b", "Synchronous schedule_at: rate and call latency")
    with stack(ctx.tmp) as s:
        app = s.use_client()
        at = time.time() + 7 * 86_400
        times = due_times(at, batched_count)
        records = _encoded(app, s._client, times)
        value = records[-1][1]
        document = app.record.build((f"o{ORDERING_IDS - 1}", batched_count, at), {},
                                    at=utc(at)).as_json()
        raw_topic = f"{s.name}_raw"
        admin = AdminClient({"bootstrap.servers": KAFKA})
        admin.create_topics([NewTopic(raw_topic, num_partitions=s.partitions,
                                      replication_factor=1)])[raw_topic].result(30)
        broker = redis.Redis.from_url(REDIS_URL)
        ours, raw, floor, many, ours_sync, p50, p99, celery_eta, send_task = (
            [] for _ in range(9))
        try:
            # One raw producer for every run, warmed up like ours: a new one per run measured
            # its connection and producer id more than its produce calls.
            producer = _raw_producer()
            warm = due_times(at - 1, 1000)
            _raw_produce(producer, raw_topic, records[:1000])
            _floor_produce(producer, raw_topic, document, warm)
            batched_rate(app, warm)
            many_rate(app, warm)
            for _ in range(ctx.runs):
                many.append(many_rate(app, times))
                ours.append(batched_rate(app, times))
                raw.append(_raw_produce(producer, raw_topic, records))
                floor.append(_floor_produce(producer, raw_topic, document, times))
                latencies = _timed_calls(
                    lambda i: app.record.schedule_at(times[i % len(times)], f"o{i % ORDERING_IDS}",
                                                     i, at), seconds)
                ours_sync.append(len(latencies) / sum(latencies))
                p50.append(percentile(latencies, 50) * 1000)
                p99.append(percentile(latencies, 99) * 1000)
                calls = _timed_calls(lambda i: app.plain.apply_async(
                    (f"o{i % ORDERING_IDS}", i, at), eta=times[i % len(times)], queue=s.name),
                    seconds)
                celery_eta.append(len(calls) / sum(calls))
                calls = _timed_calls(lambda i: app.app.send_task(
                    "bench.plain", (f"o{i % ORDERING_IDS}", i, at), queue=s.name), seconds)
                send_task.append(len(calls) / sum(calls))
                broker.delete(s.name)  # nothing consumes these; keep Redis small between runs
        finally:
            admin.delete_topics([raw_topic], operation_timeout=30)
            clean_redis(s.name)
    ratios = [ratio(a, b) for a, b in zip(many, raw, strict=True)]
    one.add("celery_scheduler `schedule_many(calls)`", Figure.of(many, "/s"))
    one.add("celery_scheduler `schedule(..., wait=False)` + `flush`", Figure.of(ours, "/s"))
    one.add("raw confluent-kafka produce, same records", Figure.of(raw, "/s"))
    one.add("ratio to raw produce", Figure.of(ratios, "%"), "≥ 60% in every run",
            Figure.of(ratios).low >= 0.6)
    one.add("`schedule(..., wait=False)` + `flush` / raw produce",
            Figure.of([ratio(a, b) for a, b in zip(ours, raw, strict=True)], "%"))
    one.add("floor: each record's document built, encoded (orjson) and produced",
            Figure.of(floor, "/s"))
    for name, over, under in (("floor / raw produce", floor, raw),
                              ("`schedule_many` / floor", many, floor)):
        one.add(name, Figure.of([ratio(a, b) for a, b in zip(over, under, strict=True)], "%"))
    one.method = [
        f"{batched_count:,} tasks per run, due 7 to 8 days ahead, each at a time of its own (a "
        f"datetime object a call, made before the clock starts), {ORDERING_IDS} ordering ids, "
        f"records of about {len(value)} bytes; rate = tasks / (time to schedule them all + flush "
        "until every ack).",
        "`schedule_many`: one call with every (at, args) of the run, made before the clock "
        "starts; it returns once Kafka acknowledged all of them. The ratio to raw produce "
        "(the target) is taken with it: it is the package's batched form.",
        "raw: one confluent-kafka Producer with the package's documented settings (murmur2_random, "
        "acks=all, idempotence, linger.ms=5) producing the bytes and keys of the run's own calls, "
        "each encoded before the clock starts (the strongest simple code), then flush; like "
        "ours, connected and warmed up (1,000 records) before the first run, and kept between runs.",
        "ours (both forms) and raw alternate in each run, on topics with the same partition "
        "count.",
        "floor: the same producer and keys, but each record made in Python as a schedule call "
        "must at least make it: a dict of the envelope's fields with the call's arguments and "
        "key, encoded with orjson (sorted keys, as the package does), produced with a delivery "
        "callback; no argument checks, envelope object or futures. The most any client that "
        "encodes each call in Python can reach on this machine.",
    ]
    sync_ratios = [ratio(a, b) for a, b in zip(ours_sync, celery_eta, strict=True)]
    sync.add("celery_scheduler `schedule_at` (waits for Kafka's ack)", Figure.of(ours_sync, "/s"))
    sync.add("`schedule_at` call latency p50", Figure.of(p50, "ms", 2))
    sync.add("`schedule_at` call latency p99", Figure.of(p99, "ms", 2))
    sync.add("Celery `apply_async(eta=...)` publish, Redis broker", Figure.of(celery_eta, "/s"))
    sync.add("plain Celery `send_task` publish (floor)", Figure.of(send_task, "/s"))
    sync.add("`schedule_at` rate / `apply_async` rate", Figure.of(sync_ratios, "%"),
             "≥ 100% (rate ≥ apply_async's)", Figure.of(sync_ratios).median >= 1.0)
    sync.method = [
        f"each form called back to back for {seconds} s per run from one thread; rate = calls / "
        "total call time; latency of every call.",
    ]
    return [one, sync]
