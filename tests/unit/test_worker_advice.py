"""The warnings a worker logs at start when its settings would make released tasks wait."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from celery import Celery

from celery_scheduler.worker_advice import WorkerSettings, advice, warn_on_ready


def settings(**changes: object) -> WorkerSettings:
    base = {"transport": "redis", "pool": "prefork", "prefetch_count": 8}
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


def test_the_solo_pool_is_flagged_on_rabbitmq_only() -> None:
    (text,) = advice(settings(transport="amqp", pool="solo", prefetch_count=1))
    assert "--pool=threads" in text and "prefork" in text
    for pool in ("prefork", "threads"):
        assert advice(settings(transport="amqp", pool=pool)) == []
    assert advice(settings(transport="redis", pool="solo", prefetch_count=1)) == []


def consumer(broker: str, prefetch: int, pool_module: str) -> SimpleNamespace:
    app = Celery("advice", broker=broker)
    pool = type("TaskPool", (), {"__module__": pool_module})()
    return SimpleNamespace(app=app, connection=app.connection_for_read(), pool=pool,
                           initial_prefetch_count=prefetch)


def test_the_ready_handler_reads_a_consumer_and_logs_each_warning(caplog: pytest.LogCaptureFixture) -> None:
    sender = consumer("amqp://guest@127.0.0.1:1//", 2, "celery.concurrency.solo")
    assert WorkerSettings.of(sender) == WorkerSettings("amqp", "solo", 2)
    with caplog.at_level(logging.WARNING, logger="celery_scheduler.worker"):
        warn_on_ready(sender=sender)
    assert len(caplog.records) == 2, caplog.text  # the prefetch count, solo on RabbitMQ
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="celery_scheduler.worker"):
        warn_on_ready(sender=consumer("redis://127.0.0.1:1/0", 1, "celery.concurrency.solo"))
    assert caplog.records == []


def test_eta_mode_asks_for_an_eta_limit_on_any_broker_and_a_supervisor_on_redis() -> None:
    (limit,) = advice(settings(release_eta=True))  # and no supervisor: redis_worker_fix
    assert "worker_eta_task_limit" in limit
    (limit,) = advice(settings(transport="amqp", release_eta=True))
    assert "worker_eta_task_limit" in limit
    assert advice(settings(transport="amqp", release_eta=True, eta_task_limit=8)) == []
    assert advice(settings(eta_task_limit=None)) == []  # not in eta mode: no eta messages


def test_the_ready_handler_reads_the_eta_mode_and_limit_from_the_app() -> None:
    sender = consumer("amqp://guest@127.0.0.1:1//", 8, "celery.concurrency.prefork")
    sender.app.conf.update(scheduler_release_eta=True, worker_eta_task_limit=8)
    assert WorkerSettings.of(sender) == WorkerSettings("amqp", "prefork", 8, True, 8)
