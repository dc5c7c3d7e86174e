"""A step's releases go to a real Redis broker in one batch: whole, in order, or counted as unsent.

Each test runs a Redis server of its own (the redis-server the services script installed),
so it can be stopped under the publisher without touching the shared one.
"""

from __future__ import annotations

import json

import pytest
import redis
from celery import Celery

from celery_scheduler.envelope import ScheduleEnvelope
from celery_scheduler.errors import ReleaseNotSentError, ReleaseUncertainError
from celery_scheduler.keys import TaskKey
from celery_scheduler.release import Publisher
from celery_scheduler.wire import Release
from tests.integration.private_redis import PrivateRedis

pytestmark = [pytest.mark.redis]

NOW = 1_893_456_000_000
QUEUE = "releases"


def queued_task_ids(server: PrivateRedis) -> list[str]:
    """Task ids in the queue, oldest first (kombu pushes on the left, workers pop the right)."""
    raw = redis.Redis.from_url(server.url).lrange(QUEUE, 0, -1)
    return [json.loads(message)["headers"]["id"] for message in reversed(raw)]


def _app(url: str) -> Celery:
    app = Celery("publish-batch", broker=url, set_as_current=False)
    app.conf.update(task_default_queue=QUEUE, broker_connection_timeout=2,
                    task_publish_retry_policy={"max_retries": 1, "interval_start": 0,
                                               "interval_step": 0.1, "interval_max": 0.1})
    return app


def _items(first: int, count: int) -> list[tuple[ScheduleEnvelope, Release]]:
    items = []
    for i in range(first, first + count):
        key = TaskKey(f"o{i}", NOW, "u")
        items.append((ScheduleEnvelope(key, "bench.record", args=[i]), Release(key, i % 12, 1, 1)))
    return items


def test_a_step_of_releases_reaches_the_queue_whole_and_in_order(private_redis: PrivateRedis) -> None:
    publisher = Publisher(_app(private_redis.url))
    try:
        items = _items(0, 200)
        # Celery's default Redis settings allow kombu's publish batches: the batch path runs
        assert publisher._in_use().supports_batch_publish
        assert publisher.publish_many(items) == [None] * len(items)
        assert queued_task_ids(private_redis) == [release.key.task_id for _, release in items]
    finally:
        publisher.close()


def test_a_batch_cut_off_may_have_been_sent_and_one_without_a_connection_was_not(
        private_redis: PrivateRedis) -> None:
    publisher = Publisher(_app(private_redis.url))
    try:
        assert publisher.publish_many(_items(0, 1)) == [None]  # a connection in use
        private_redis.stop()
        results = publisher.publish_many(_items(1, 50))
        # the connection failed under the batch: Redis may have taken any part of it
        assert len(results) == 50 and all(isinstance(e, ReleaseUncertainError) for e in results)
        results = publisher.publish_many(_items(51, 10))
        # a fresh producer proves its connection first: nothing of this one was sent
        assert len(results) == 10 and all(isinstance(e, ReleaseNotSentError) for e in results)
        private_redis.start()  # empty: it keeps nothing on disk
        again = _items(1, 50)
        assert publisher.publish_many(again) == [None] * 50  # a fresh producer after the failure
        assert queued_task_ids(private_redis) == [release.key.task_id for _, release in again]
    finally:
        publisher.close()


def test_one_redis_client_serves_every_step(private_redis: PrivateRedis,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[object] = []
    original = redis.Redis.__init__

    def counting(self: redis.Redis, *args: object, **kwargs: object) -> None:
        made.append(self)
        original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(redis.Redis, "__init__", counting)
    publisher = Publisher(_app(private_redis.url))
    try:
        steps = [_items(i * 10, 10) for i in range(20)] + [_items(200 + i, 1) for i in range(20)]
        for items in steps:
            assert publisher.publish_many(items) == [None] * len(items)
        assert len(made) <= 2, f"{len(made)} Redis clients made for {len(steps)} steps"
        assert queued_task_ids(private_redis) == [release.key.task_id for items in steps
                                            for _, release in items]
    finally:
        publisher.close()

