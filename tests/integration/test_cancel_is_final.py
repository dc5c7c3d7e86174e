"""A cancel is final: a schedule record read again after its cancel does not revive the task.

Kafka delivers at least once: a dispatcher that could not commit a batch (Kafka restarted)
or a new owner after a rebalance reads the schedule record again after its cancel was
applied. The chaos run found the task then ran (``scripts/chaos --quick``, seed 1).
"""

from __future__ import annotations

from celery_scheduler.dispatcher.engine import Engine
from celery_scheduler.store.base import Cancel, Cursor, Put, ScheduleStore, State
from tests.integration.test_store_contract import NOW, B, envelope
from tests.integration.test_store_contract import store as store  # the fixture: both stores


def test_a_schedule_record_read_again_after_its_cancel_is_ignored(store: ScheduleStore) -> None:
    task = envelope("a", NOW)
    assert store.apply([Put(2, task)], NOW) != [None]
    assert store.apply([Cancel(2, task.key)], NOW + 1) == [True]

    # the same batch, re-read: the schedule record comes back first, then its cancel
    assert store.apply([Put(2, task)], NOW + 2) == [None]
    assert store.put(2, task, NOW + 3) is None
    assert store.apply([Cancel(2, task.key)], NOW + 4) == [False]

    assert store.read(2, Cursor(B), 10) == []
    status = store.status(task.key)
    assert status is not None and status.state is State.CANCELLED


def test_the_engine_never_sees_the_revived_task(store: ScheduleStore) -> None:
    released = []
    engine = Engine(store, lambda task, release: released.append(task.key), "owner",
                    clock=lambda: NOW + 10_000)
    engine.assign([2])
    task = envelope("a", NOW)
    store.put(2, task, NOW)
    store.cancel(2, task.key, NOW + 1)
    store.put(2, task, NOW + 2)  # read again after the cancel

    for _ in range(5):
        engine.step()

    assert released == []
