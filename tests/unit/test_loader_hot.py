"""A hot ordering id (thousands of tasks due at once) does not take its partition's memory
from the other ordering ids: the loader keeps a few of it loaded, tops them up as they run,
and loads them in order (loader.py)."""

from __future__ import annotations

from typing import Any

import pytest

from celery_scheduler.dispatcher.loader import TOP_UP_EVERY_MS, PartitionLoader
from celery_scheduler.dispatcher.timetable import Timetable
from celery_scheduler.envelope import ScheduleEnvelope
from celery_scheduler.errors import StoreUnavailableError
from celery_scheduler.keys import TaskKey
from celery_scheduler.store.base import State, StoredTask
from celery_scheduler.store.memory import MemoryScheduleStore

NOW = 1_700_000_000_000
HOT = "hot"


def _put(store: MemoryScheduleStore, ordering_id: str, at_ms: int, unique: str) -> StoredTask:
    stored = store.put(0, ScheduleEnvelope(TaskKey(ordering_id, at_ms, unique), "t"), NOW)
    assert stored is not None
    return stored


def _setup(most_per_id: int, hot: int = 20, others: int = 3, max_loaded: int = 10
           ) -> tuple[MemoryScheduleStore, PartitionLoader, Timetable]:
    store = MemoryScheduleStore()
    for n in range(hot):
        _put(store, HOT, NOW + 1_000, f"u{n:03}")
    for n in range(others):  # due with the hot ones, after them in the schedule's order
        _put(store, f"other-{n}", NOW + 1_000, "u")
    loader = PartitionLoader(store, 0, page_size=5, max_loaded=max_loaded)
    loader.most_per_id = most_per_id
    return store, loader, Timetable()


def _loaded(timetable: Timetable, ordering_id: str) -> list[str]:
    return sorted(t.key.uniqueness_key for t in timetable.partition_tasks(0)
                  if t.key.ordering_id == ordering_id)


@pytest.mark.parametrize("capped", [True, False])
def test_the_other_ordering_ids_of_the_partition_are_loaded_beside_a_hot_one(capped: bool) -> None:
    """The broken variant (*capped* False, the hot id may take all the room) loads none of
    the others until the hot id has mostly run."""
    _, loader, timetable = _setup(most_per_id=4 if capped else 10_000)
    loader.fill(timetable, NOW)
    others = [t for t in timetable.partition_tasks(0) if t.key.ordering_id != HOT]
    assert (len(others) == 3) is capped
    assert (_loaded(timetable, HOT) == [f"u{n:03}" for n in range(4)]) is capped


def test_a_hot_ordering_id_is_topped_up_as_it_runs_and_runs_in_order() -> None:
    store, loader, timetable = _setup(most_per_id=4)
    now = NOW
    loader.fill(timetable, now)
    ran: list[str] = []
    while len(ran) < 20:
        [task] = [t for t in timetable.take_due(now + 2_000) if t.key.ordering_id == HOT] or [None]
        if task is None:
            now += TOP_UP_EVERY_MS
            assert loader.due_for_fill(now)
            loader.fill(timetable, now)
            continue
        assert timetable.loaded_of(HOT) <= 4
        ran.append(task.key.uniqueness_key)
        store.finish(task.stored, State.SUCCEEDED, None, now)
        timetable.remove(task.key)
        for other in [t for t in timetable.in_flight() if t.key.ordering_id != HOT]:
            timetable.remove(other.key)
    assert ran == [f"u{n:03}" for n in range(20)]
    assert loader.hot == {}


def test_a_row_written_before_the_loaded_ones_of_a_hot_id_takes_the_place_of_the_last() -> None:
    store, loader, timetable = _setup(most_per_id=4)
    loader.fill(timetable, NOW)
    early = _put(store, HOT, NOW + 500, "early")  # due before every one loaded
    loader.persisted(early, timetable)
    assert _loaded(timetable, HOT) == ["early", "u000", "u001", "u002"]
    assert loader.hot[HOT] == timetable_position(store, HOT, "u003")
    late = _put(store, HOT, NOW + 5_000, "late")  # after the first left in the store
    loader.persisted(late, timetable)
    assert "late" not in _loaded(timetable, HOT)


def timetable_position(store: MemoryScheduleStore, ordering_id: str, unique: str) -> Any:
    task = store.task(TaskKey(ordering_id, NOW + 1_000, unique))
    assert task is not None
    return task.position


class FailingOnce(MemoryScheduleStore):
    def __init__(self) -> None:
        super().__init__()
        self.fail = False

    def read(self, *args: Any, **kwargs: Any) -> Any:
        if self.fail:
            self.fail = False
            raise StoreUnavailableError("Cassandra could not read: down")
        return super().read(*args, **kwargs)


def test_a_top_up_cut_short_by_a_store_error_is_made_again() -> None:
    store = FailingOnce()
    for n in range(10):
        _put(store, HOT, NOW + 1_000, f"u{n:03}")
    loader = PartitionLoader(store, 0, page_size=5, max_loaded=100)
    loader.most_per_id = 4
    timetable = Timetable()
    loader.fill(timetable, NOW)
    for task in [t for t in timetable.partition_tasks(0)][:3]:
        timetable.remove(task.key)
    store.fail = True
    with pytest.raises(StoreUnavailableError):
        loader.fill(timetable, NOW + TOP_UP_EVERY_MS)
    assert HOT in loader.hot
    loader.fill(timetable, NOW + 2 * TOP_UP_EVERY_MS)
    assert _loaded(timetable, HOT) == ["u003", "u004", "u005", "u006"]
