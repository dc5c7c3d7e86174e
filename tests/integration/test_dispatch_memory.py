"""Bounded memory: far-future tasks live in Cassandra, not in the dispatcher."""

from __future__ import annotations

import os
import time

import psutil
import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.integration.dispatch_fixtures import Scheduler
from tests.integration.test_dispatch import utc

# serial: a dispatcher's memory is measured while it stores 100,000 tasks, with no other test's
pytestmark = [pytest.mark.kafka, pytest.mark.cassandra, pytest.mark.redis, pytest.mark.serial]

TASKS = int(os.environ.get("CELERY_SCHEDULER_MEMORY_TASKS", "100000"))
# The dispatcher's resident memory may not exceed this, whatever the number of far-future
# tasks (measured: about 100 MB at 100,000; the bound leaves room for allocator noise).
RSS_LIMIT_MB = 200


def committed_lag(bootstrap: str, group: str, topic: str, partitions: int) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        parts = [TopicPartition(topic, p) for p in range(partitions)]
        committed = consumer.committed(parts, timeout=10)
        lag = 0
        for tp in committed:
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, tp.partition), timeout=10)
            lag += high - max(tp.offset, 0)
        return lag
    finally:
        consumer.close()


def test_dispatcher_memory_is_bounded_with_100k_tasks_a_week_ahead(
        scheduler: Scheduler, schedule, kafka_bootstrap: str) -> None:
    topic = scheduler.env["CELERY_SCHEDULER_TEST_TOPIC"]
    week_ahead = time.time() + 7 * 86_400
    started = time.monotonic()
    for i in range(TASKS):
        schedule.record.schedule((f"o{i % 1000}", i), {}, at=utc(week_ahead + i * 0.5), wait=False)
    assert schedule.record.client.flush(120) == 0
    produced = time.monotonic() - started

    dispatcher = scheduler.dispatcher()
    process = psutil.Process(dispatcher.pid)
    baseline = process.memory_info().rss
    peak = baseline
    started = time.monotonic()
    while committed_lag(kafka_bootstrap, f"{topic}.dispatchers", topic, 6) > 0:
        peak = max(peak, process.memory_info().rss)
        assert time.monotonic() - started < 600, "ingest did not finish within 10 minutes"
        time.sleep(0.5)
    ingest = time.monotonic() - started
    peak = max(peak, process.memory_info().rss)

    mb = 1024 * 1024
    print(f"\n{TASKS} tasks a week ahead: produced in {produced:.1f}s ({TASKS / produced:.0f}/s), "
          f"persisted in {ingest:.1f}s ({TASKS / ingest:.0f}/s); dispatcher RSS "
          f"{baseline / mb:.0f} MB idle, {peak / mb:.0f} MB peak")
    assert peak < RSS_LIMIT_MB * mb
