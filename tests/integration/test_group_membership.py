"""A dispatcher whose Kafka consumer is out of its group, with nobody else to own the
topic, joins the group again with a new consumer and releases again (real Kafka,
Cassandra, Redis and a Celery worker)."""

from __future__ import annotations

import datetime as dt
import gc
import logging
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from celery_scheduler.config import get_settings
from celery_scheduler.dispatcher.membership import Membership
from celery_scheduler.dispatcher.service import Dispatcher
from tests.integration.dispatch_fixtures import Scheduler, schedule, scheduler  # noqa: F401
from tests.waiting import wait_until


def _held(dispatcher: Dispatcher) -> list[int]:
    return sorted(n for n, p in dict(dispatcher.engine.partitions).items() if p.lease is not None)


def _dispatcher(scheduler: Scheduler) -> Dispatcher:  # noqa: F811
    from tests.apps import dispatching

    settings = get_settings(dispatching.app).replace(
        kafka_topic=scheduler.env["CELERY_SCHEDULER_TEST_TOPIC"],
        cassandra_keyspace=scheduler.env["CELERY_SCHEDULER_TEST_KEYSPACE"])
    return Dispatcher(dispatching.app, settings=settings)


@pytest.fixture
def dispatcher(scheduler: Scheduler) -> Iterator[Dispatcher]:  # noqa: F811
    running = _dispatcher(scheduler)
    # judged after 2 s without a partition instead of 20, leases ownerless as soon as they end
    running.membership = Membership(running.partition_count, time.monotonic(),
                                    unassigned_seconds=2.0, orphan_seconds=0.0, check_seconds=0.5)
    yield from _running(running)


@pytest.fixture
def losing(scheduler: Scheduler) -> Iterator[tuple[Dispatcher, threading.Event]]:  # noqa: F811
    """A dispatcher whose partitions, once the event is set, are taken from it as *lost*
    (the session ended) when its consumer leaves the group."""
    running = _dispatcher(scheduler)
    # kept as long as the test may take, not the 20 s a broker restart needs
    running.membership = Membership(running.partition_count, time.monotonic(), lost_hold_seconds=60.0)
    lose = threading.Event()
    revoke = running._on_revoke

    def revoke_or_lose(partitions: list[int]) -> None:
        (running._on_lost if lose.is_set() else revoke)(partitions)

    running._on_revoke = revoke_or_lose  # type: ignore[method-assign]
    for _ in _running(running):
        yield running, lose


def _running(running: Dispatcher) -> Iterator[Dispatcher]:
    switch = sys.getswitchinterval()
    thread = threading.Thread(target=running.run, name="dispatcher", daemon=True)
    thread.start()
    try:
        yield running
    finally:
        running.stop()
        thread.join(60)
        sys.setswitchinterval(switch)  # run() tunes these for a process of its own
        gc.unfreeze()
    assert not thread.is_alive()


def test_a_dispatcher_out_of_its_group_joins_it_again(
        scheduler: Scheduler, schedule: Any, dispatcher: Dispatcher,  # noqa: F811
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="celery_scheduler.dispatcher.service")
    every = list(range(dispatcher.partition_count))
    wait_until(lambda: _held(dispatcher) == every, 60, "leases of every partition")
    first = dispatcher.reader.consumer

    # Out of the group, as a consumer that lost its session and never got back is: it holds
    # nothing, and the group has no other member to take the topic. (Left on the thread
    # that reads it, which serves the revocation.)
    poll_once = dispatcher.ingest.poll_once

    def leave_then_poll(timeout: float = 0.2) -> int:
        if dispatcher.reader.consumer is first and first.assignment():
            first.unsubscribe()
        return poll_once(timeout)

    dispatcher.ingest.poll_once = leave_then_poll  # type: ignore[method-assign]
    wait_until(lambda: not _held(dispatcher), 30, "the partitions handed over")

    wait_until(lambda: dispatcher.membership.rejoins == 1, 30, "a new consumer")
    assert dispatcher.reader.consumer is not first
    assert any("seems to be out of the group" in r.getMessage() for r in caplog.records)
    wait_until(lambda: _held(dispatcher) == every, 60, "leases of every partition again")

    # and it releases again: a task scheduled now runs on a worker
    scheduler.worker()
    due = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=1)
    # (this process's app has its default queue, not the test's)
    schedule.record.schedule(("rejoined", 0), at=due, queue=scheduler.env["CELERY_SCHEDULER_TEST_QUEUE"])
    scheduler.wait_for_starts(1, timeout=60)
    assert [(s["o"], s["seq"]) for s in scheduler.starts()] == [("rejoined", 0)]
    assert dispatcher.membership.rejoins == 1  # holding partitions, it stays with this consumer


def test_a_dispatcher_goes_on_releasing_from_partitions_its_group_session_lost(
        scheduler: Scheduler, schedule: Any,  # noqa: F811
        losing: tuple[Dispatcher, threading.Event], caplog: pytest.LogCaptureFixture) -> None:
    dispatcher, lose = losing
    caplog.set_level(logging.INFO, logger="celery_scheduler.dispatcher.service")
    every = list(range(dispatcher.partition_count))
    wait_until(lambda: _held(dispatcher) == every, 60, "leases of every partition")
    epochs = {n: p.lease.epoch for n, p in dict(dispatcher.engine.partitions).items() if p.lease}
    scheduler.worker()
    queue = scheduler.env["CELERY_SCHEDULER_TEST_QUEUE"]
    due = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=6)
    for ordering_id in ("a", "b", "c"):
        schedule.record.schedule((ordering_id, 0), at=due, queue=queue)
    wait_until(lambda: dispatcher.ingest.persisted_count >= 3, 30, "the tasks persisted")

    # Kafka ends the session: the consumer's partitions are lost, and it is out of the group
    # (left on the thread that reads it, which serves the callback)
    lose.set()
    consumer, poll_once = dispatcher.reader.consumer, dispatcher.ingest.poll_once
    rejoin = threading.Event()

    def leave_then_poll(timeout: float = 0.2) -> int:
        if rejoin.is_set() and not consumer.assignment():
            rejoin.clear()
            lose.clear()
            dispatcher._subscribe()  # the group forms again
        elif lose.is_set() and consumer.assignment():
            consumer.unsubscribe()
        return poll_once(timeout)

    dispatcher.ingest.poll_once = leave_then_poll  # type: ignore[method-assign]
    wait_until(lambda: dispatcher.membership.kept == every, 30, "the partitions lost and kept")
    assert any("ended this dispatcher's group session" in r.getMessage() for r in caplog.records)

    # still unassigned, it releases the tasks when due: they run on time
    scheduler.wait_for_starts(3, timeout=30)
    assert dispatcher.membership.kept == every
    assert not consumer.assignment()
    assert sorted(s["o"] for s in scheduler.starts()) == ["a", "b", "c"]

    # what is scheduled meanwhile is read from the kept partitions by a consumer assigned by
    # hand: it runs when due, before the group forms again
    due = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=3)
    schedule.record.schedule(("d", 0), at=due, queue=queue)
    scheduler.wait_for_starts(4, timeout=30)
    assert not consumer.assignment() and dispatcher.membership.kept == every
    assert dispatcher.kept.partitions == every

    # assigned again, it keeps the partitions: their leases were never let go
    rejoin.set()
    # (judged from the callbacks' record: the consumer is not asked from this thread, where
    # a call during its rebalance can block)
    wait_until(lambda: not dispatcher.membership.kept
          and dispatcher.membership.unassigned_for(time.monotonic()) == 0.0, 60,
          "the partitions assigned again")
    assert {n: p.lease.epoch for n, p in dict(dispatcher.engine.partitions).items()
            if p.lease} == epochs
    assert not any("handed over" in r.getMessage() for r in caplog.records)
    due = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=1)
    wait_until(lambda: dispatcher.kept.partitions == [], 10, "the kept partitions' consumer closed")
    schedule.record.schedule(("a", 1), at=due, queue=queue)
    scheduler.wait_for_starts(5, timeout=60)
    # ("d", 0) was read again by the group's consumer, and not run again
    assert sorted((s["o"], s["seq"]) for s in scheduler.starts()) == [
        ("a", 0), ("a", 1), ("b", 0), ("c", 0), ("d", 0)]
