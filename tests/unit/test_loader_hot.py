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
from tests.unit.fakes import OutageStore

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


def _filled(store: MemoryScheduleStore, most_per_id: int, **sizes: Any
            ) -> tuple[PartitionLoader, Timetable]:
    """A loader of partition 0 of *store* keeping *most_per_id* of an ordering id, filled once."""
    loader = PartitionLoader(store, 0, **sizes)
    loader.most_per_id = most_per_id
    timetable = Timetable()
    loader.fill(timetable, NOW)
    return loader, timetable


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


def test_a_top_up_cut_short_by_a_store_error_is_made_again() -> None:
    store = OutageStore("read")
    for n in range(10):
        _put(store, HOT, NOW + 1_000, f"u{n:03}")
    loader, timetable = _filled(store, 4, page_size=5, max_loaded=100)
    for task in [t for t in timetable.partition_tasks(0)][:3]:
        timetable.remove(task.key)
    store.down = True
    with pytest.raises(StoreUnavailableError):
        loader.fill(timetable, NOW + TOP_UP_EVERY_MS)
    store.down = False
    assert HOT in loader.hot
    loader.fill(timetable, NOW + 2 * TOP_UP_EVERY_MS)
    assert _loaded(timetable, HOT) == ["u003", "u004", "u005", "u006"]


def _run_all(store: MemoryScheduleStore, loader: PartitionLoader, timetable: Timetable, now: int
             ) -> list[str]:
    ran = []
    for _ in range(40):
        for task in timetable.take_due(now):
            ran.append(task.key.uniqueness_key)
            store.finish(task.stored, State.SUCCEEDED, None, now)
            timetable.remove(task.key)
        now += TOP_UP_EVERY_MS
        if loader.due_for_fill(now):
            loader.fill(timetable, now)
    return ran


def test_a_top_up_cut_short_after_a_page_goes_on_after_what_it_loaded() -> None:
    """The bucket index failed after a short page was loaded: read again from the page's
    start, a row written between two loaded ones was passed over and ran after them."""
    store = OutageStore("buckets")
    for n in range(14):
        _put(store, HOT, NOW + 1_000, f"u{n:03}0")
    _put(store, "z", NOW + 120_000, "u")  # a later bucket: the cursor goes past the hot one's
    loader, timetable = _filled(store, 8, page_size=10, max_loaded=100, lookahead_ms=600_000)
    for n in range(6):  # six of it ran
        [task] = [t for t in timetable.partition_tasks(0) if t.key.uniqueness_key == f"u{n:03}0"]
        store.finish(task.stored, State.SUCCEEDED, None, NOW)
        timetable.remove(task.key)
    store.down = True
    with pytest.raises(StoreUnavailableError):
        loader.fill(timetable, NOW + TOP_UP_EVERY_MS)  # a page loaded, then the index read fails
    store.down = False
    loader.persisted(_put(store, HOT, NOW + 1_000, "u0085"), timetable)  # between two loaded
    ran = [u for u in _run_all(store, loader, timetable, NOW + 2_000) if u != "u"]
    assert ran == sorted(ran)
    assert len(ran) == 9  # the eight left and the one written


def test_a_row_written_late_runs_before_the_later_ones_loaded() -> None:
    """Written well after its time, a row lands in a bucket after those of the tasks due
    after it: it is in the store after them, but runs before them."""
    store, loader, timetable = _setup(most_per_id=4)
    now = NOW + 300_000  # all of them overdue
    loader.fill(timetable, now)
    late = store.put(0, ScheduleEnvelope(TaskKey(HOT, NOW + 500, "late"), "t"), now)
    assert late is not None and late.bucket > timetable_position(store, HOT, "u000").bucket
    loader.persisted(late, timetable)
    assert _loaded(timetable, HOT) == ["late", "u000", "u001", "u002"]
    ran = [u for u in _run_all(store, loader, timetable, now) if u != "u"]
    assert ran == ["late"] + [f"u{n:03}" for n in range(20)]


class Counting(MemoryScheduleStore):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def read(self, *args: Any, **kwargs: Any) -> Any:
        self.reads += 1
        return super().read(*args, **kwargs)


def test_a_fill_with_little_room_reads_a_hot_run_a_page_at_a_time() -> None:
    store = Counting()
    for n in range(9):
        _put(store, f"a{n}", NOW + 500, "u")
    for n in range(600):
        _put(store, HOT, NOW + 1_000, f"u{n:04}")
    loader, timetable = _filled(store, 1, page_size=100, max_loaded=10)
    assert timetable.count(0) == 10
    [task] = [t for t in timetable.partition_tasks(0) if t.key.ordering_id == "a0"]
    timetable.remove(task.key)
    loader.room_freed(timetable.count(0))
    store.reads = 0
    loader.fill(timetable, NOW + 1_500)  # one place free: passing rows over takes none
    assert store.reads <= 10
