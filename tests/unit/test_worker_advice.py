"""The warnings a worker logs at start when its settings would make released tasks wait."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from celery import Celery

from celery_scheduler.worker_advice import WorkerSettings, advice, warn_on_ready


def settings(**changes: object) -> WorkerSettings:
    base = {"transport": "redis", "pool": "prefork", "prefetch_count": 8,
            "prefetch_count_reduction": True}
    return WorkerSettings(**{**base, **changes})  # type: ignore[arg-type]


def test_a_prefork_worker_on_redis_gets_no_advice() -> None:
    assert advice(settings()) == []


@pytest.mark.parametrize("prefetch", [2, 0])
def test_a_solo_worker_that_prefetches_more_than_it_runs_is_told_to_use_concurrency_one(
        prefetch: int) -> None:
    (text,) = advice(settings(pool="solo", prefetch_count=prefetch))
    assert "--concurrency=1" in text
    assert ("no limit" if prefetch == 0 else f"prefetches {prefetch} messages") in text


def test_a_solo_worker_with_one_message_gets_no_advice() -> None:
    assert advice(settings(pool="solo", prefetch_count=1)) == []


def test_prefetch_count_reduction_is_flagged_on_rabbitmq_only() -> None:
    (text,) = advice(settings(transport="amqp"))
    assert "worker_enable_prefetch_count_reduction = False" in text
    assert advice(settings(transport="amqp", prefetch_count_reduction=False)) == []
    assert advice(settings(transport="redis", prefetch_count_reduction=True)) == []


def consumer(broker: str, prefetch: int, reduction: bool, pool_module: str) -> SimpleNamespace:
    app = Celery("advice", broker=broker)
    app.conf.worker_enable_prefetch_count_reduction = reduction
    pool = type("TaskPool", (), {"__module__": pool_module})()
    return SimpleNamespace(app=app, connection=app.connection_for_read(), pool=pool,
                           initial_prefetch_count=prefetch)


def test_the_ready_handler_reads_a_consumer_and_logs_each_warning(caplog: pytest.LogCaptureFixture) -> None:
    sender = consumer("amqp://guest@127.0.0.1:1//", 2, True, "celery.concurrency.solo")
    assert WorkerSettings.of(sender) == WorkerSettings("amqp", "solo", 2, True)
    with caplog.at_level(logging.WARNING, logger="celery_scheduler.worker"):
        warn_on_ready(sender=sender)
    assert len(caplog.records) == 2, caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="celery_scheduler.worker"):
        warn_on_ready(sender=consumer("redis://127.0.0.1:1/0", 1, True, "celery.concurrency.solo"))
    assert caplog.records == []
