"""pytest plugin: the ``celery_scheduler`` and ``celery_scheduler_dispatcher`` fixtures
(registered through the ``pytest11`` entry point).

It follows the ``celery_app`` fixture convention of ``celery.contrib.pytest``: define a
``celery_app`` fixture that returns your app (or enable Celery's plugin, whose
``celery_app`` is a test app), and ask for ``celery_scheduler``::

    @pytest.fixture
    def celery_app():
        return proj.celery.app

    def test_reminder(celery_scheduler):
        proj.tasks.send_reminder.schedule_in(3600, "customer-42")
        [run] = celery_scheduler.advance(3600)
        assert run.succeeded

See :func:`celery_scheduler.testing.scheduler_testing` for what runs inside.

``celery_scheduler_dispatcher`` is for integration tests against real services: a real
dispatcher of the same app, in a thread of the test process, on the Kafka and Cassandra the
app's settings name. Beside Celery's embedded ``celery_worker`` (``celery.contrib.pytest``),
a test schedules, the dispatcher releases to the app's broker, and the worker runs the task
and reports its outcome, all in one process.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from celery_scheduler.config import get_settings
from celery_scheduler.errors import ConfigurationError
from celery_scheduler.testing import SchedulerTesting, scheduler_testing

__all__ = ["celery_scheduler", "celery_scheduler_dispatcher"]


@pytest.fixture
def celery_scheduler(request: pytest.FixtureRequest) -> Iterator[SchedulerTesting]:
    """The ``celery_app`` fixture's app, its schedule calls run by an in-memory dispatcher."""
    with scheduler_testing(_celery_app(request, "celery_scheduler")) as scheduler:
        yield scheduler


# How long the dispatcher fixture waits for its dispatcher to lease every partition.
READY_TIMEOUT = 60.0


@pytest.fixture
def celery_scheduler_dispatcher(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A real dispatcher of the ``celery_app`` fixture's app, running in a thread.

    It creates the app's topics and keyspace if missing (``scheduler init``), starts, and
    is handed to the test once it leased every partition; it stops (handing its partitions
    over) after the test. Define the app's scheduled tasks before it starts: a dispatcher
    releases the tasks registered when it started, and dead-letters the others.
    """
    from celery_scheduler.dispatcher.service import Dispatcher
    from celery_scheduler.environment import create

    app = _celery_app(request, "celery_scheduler_dispatcher")
    create(get_settings(app), say=lambda line: None)
    switch_interval = sys.getswitchinterval()
    dispatcher = Dispatcher(app)
    failed: list[BaseException] = []

    def run() -> None:
        try:
            dispatcher.run()
        except BaseException as exc:  # shown in the test, not lost in a thread
            failed.append(exc)

    thread = threading.Thread(target=run, name="celery-scheduler-dispatcher", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        while len(_leased_by(dispatcher)) < dispatcher.partition_count:
            if failed or not thread.is_alive():
                raise ConfigurationError(f"the dispatcher stopped before it was ready: {failed!r}")
            if time.monotonic() > deadline:
                raise ConfigurationError(
                    f"the dispatcher leased {len(_leased_by(dispatcher))} of "
                    f"{dispatcher.partition_count} partitions in {READY_TIMEOUT:g}s: is another "
                    "dispatcher of this topic running?")
            time.sleep(0.1)
        yield dispatcher
    finally:
        dispatcher.stop()
        thread.join(READY_TIMEOUT)
        # what the dispatcher set for its own process, given back to the test run's
        sys.setswitchinterval(switch_interval)
        gc.unfreeze()
    if failed:
        raise failed[0]


def _leased_by(dispatcher: Any) -> set[int]:
    """The partitions whose lease *dispatcher* holds now, as the store says."""
    from celery_scheduler.clock import now_ms

    now = now_ms()
    return {lease.partition for lease in dispatcher.store.leases()
            if lease.owner == dispatcher.owner and lease.expires_ms > now}


def _celery_app(request: pytest.FixtureRequest, fixture: str) -> Any:
    try:
        return request.getfixturevalue("celery_app")
    except pytest.FixtureLookupError:
        raise ConfigurationError(
            f"the {fixture} fixture needs a celery_app fixture that returns your Celery app; "
            "define one in conftest.py, or enable celery.contrib.pytest") from None
