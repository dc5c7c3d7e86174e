"""What operators see of the store: partitions and one task key (memory store)."""

from __future__ import annotations

from celery_scheduler.envelope import ScheduleEnvelope
from celery_scheduler.keys import TaskKey
from celery_scheduler.operations import DeadLetter, describe_key, partitions, replay
from celery_scheduler.store.memory import MemoryScheduleStore

NOW = 1_893_456_000_000


def test_partitions_show_owner_lease_backlog_and_how_overdue() -> None:
    store = MemoryScheduleStore()
    store.put(1, ScheduleEnvelope(TaskKey("a", NOW - 30_000, "u"), "unit.remind"), NOW)
    store.put(1, ScheduleEnvelope(TaskKey("b", NOW + 60_000, "u"), "unit.remind"), NOW)
    store.acquire_lease(1, "dispatcher-1", 10_000, NOW)
    store.acquire_lease(2, "dispatcher-2", 10_000, NOW - 60_000)  # expired long ago
    views = {v.partition: v for v in partitions(3, store, NOW, {0: 0, 1: 5, 2: None})}
    assert set(views) == {0, 1, 2}
    assert (views[1].owner, views[1].leased, views[1].pending, views[1].lag) == ("dispatcher-1", True, 2, 5)
    assert views[1].overdue_seconds == 30.0 and views[1].oldest == "2029-12-31T23:59:30+00:00"
    assert (views[2].owner, views[2].leased, views[2].pending) == ("dispatcher-2", False, 0)
    assert (views[0].owner, views[0].pending, views[0].overdue_seconds) == (None, 0, 0.0)


def test_a_key_is_described_with_its_task_arguments_and_status() -> None:
    store = MemoryScheduleStore()
    key = TaskKey("customer-42", NOW, "welcome")
    stored = store.put(3, ScheduleEnvelope(key, "unit.remind", args=["customer-42"],
                                           kwargs={"kind": "x" * 1000}), NOW - 1000)
    assert stored is not None
    store.mark_released(stored, 1, NOW + 300_000, NOW)
    described = describe_key(store, key)
    assert described is not None
    assert (described["state"], described["attempts"], described["partition"]) == ("released", 1, 3)
    assert described["task_id"] == key.task_id and described["args"] == '["customer-42"]'
    assert len(described["kwargs"]) == 300 and described["kwargs"].endswith("...")  # cut short
    assert described["lease_until"] == "2030-01-01T00:05:00+00:00"
    assert describe_key(store, TaskKey("nobody", NOW, "u")) is None


def test_replay_publishes_each_letter_under_its_key_and_skips_those_without() -> None:
    sent: list[tuple[str, bytes]] = []
    letters = [DeadLetter(0, "task 'x' is not a registered scheduled task", "t/0/5", b"a", b"{}", "x"),
               DeadLetter(1, "record has no value", "t/0/6", b"b", None, None)]
    assert replay(lambda key, data: sent.append((key, data)), iter(letters)) == (1, 1)
    assert sent == [("a", b"{}")]


def test_an_ordering_ids_tasks_are_listed_in_the_order_they_will_run() -> None:
    from celery_scheduler.operations import ordering_id_tasks
    from celery_scheduler.partitioner import partition_for

    store = MemoryScheduleStore()
    partition = partition_for("a", 12)
    stored = [store.put(partition, ScheduleEnvelope(TaskKey("a", NOW + n * 1000, f"u{n}"), "unit.remind"),
                        NOW) for n in (2, 0, 1)]
    store.put(partition_for("b", 12), ScheduleEnvelope(TaskKey("b", NOW, "u"), "unit.remind"), NOW)
    first = stored[1]
    assert first is not None
    store.mark_released(first, 1, NOW + 300_000, NOW)
    tasks = ordering_id_tasks(store, 12, "a")
    assert [t["unique"] for t in tasks] == ["u0", "u1", "u2"]
    assert [t["state"] for t in tasks] == ["released", "pending", "pending"]
    assert tasks[0]["lease_until"] == "2030-01-01T00:05:00+00:00" and tasks[0]["attempts"] == 1
    assert ordering_id_tasks(store, 12, "nobody") == []
