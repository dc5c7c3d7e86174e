"""Inside scheduler_testing, no schedule call can reach a real Kafka: a call for an app the
block does not route is refused, whichever way it found that app."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery import Celery, shared_task
from celery._state import get_current_app

from celery_scheduler import scheduled_task
from celery_scheduler.client import SchedulerClient, get_client, set_client
from celery_scheduler.config import get_settings
from celery_scheduler.errors import NotUnderTestError
from celery_scheduler.tasklog.memory import MemoryTaskLog
from celery_scheduler.testing import scheduler_testing
from tests.unit.apps import app as tested
from tests.unit.apps import remind


@scheduled_task(ordering_id="customer_id")
@shared_task(name="leak.notify")
def notify(customer_id: str) -> str:
    return customer_id


@pytest.fixture
def other() -> Celery:
    """A second app of the process (a Flask factory's beside a Django project's, say), its
    "real Kafka" a stand-in that records what reaches it."""
    other = Celery("other", broker="memory://", set_as_current=False)
    other.conf.scheduler_kafka_bootstrap_servers = "127.0.0.1:1"
    set_client(other, SchedulerClient(get_settings(other), task_log=MemoryTaskLog(12)))
    return other


@pytest.fixture(autouse=True)
def current_app_kept() -> Iterator[None]:
    before = get_current_app()
    yield
    before.set_current()


def reached(app: Celery) -> int:
    task_log = get_client(app).task_log
    assert isinstance(task_log, MemoryTaskLog)
    return len(task_log.records())


def test_a_shared_task_called_with_another_app_current_is_refused(other: Celery) -> None:
    other.set_current()
    with scheduler_testing(tested) as scheduler:
        with pytest.raises(NotUnderTestError, match=r"app 'other'.*set_current"):
            notify.schedule_in(60, "c1")
        tested.set_current()  # as the message says: the app under test current
        notify.schedule_in(60, "c1")
        assert [e.key.ordering_id for e in scheduler.pending()] == ["c1"]
    assert reached(other) == 0  # nothing went to the other app's Kafka


def test_an_app_not_under_test_is_refused_while_a_block_is_active_and_free_after(
        other: Celery) -> None:
    with scheduler_testing(tested), scheduler_testing(tested):  # nested blocks of one app
        with pytest.raises(NotUnderTestError, match="'unit'"):
            get_client(other)
        remind.schedule_in(60, "c1")  # the app under test: to memory
    assert reached(other) == 0
    other.set_current()
    notify.schedule_in(60, "c2")  # after the block: to the other app's own, as always
    assert reached(other) == 1


def test_each_app_of_the_test_may_be_routed(other: Celery) -> None:
    with scheduler_testing(tested) as first, scheduler_testing(other) as second:
        remind.schedule_in(60, "c1")
        other.set_current()
        notify.schedule_in(60, "c2")
        assert [e.key.ordering_id for e in first.pending()] == ["c1"]
        assert [e.key.ordering_id for e in second.pending()] == ["c2"]
