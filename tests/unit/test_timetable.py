from __future__ import annotations

import random

from celery_scheduler.dispatcher.timetable import Loaded, Timetable
from celery_scheduler.envelope import ScheduleEnvelope
from celery_scheduler.keys import TaskKey


def loaded(ordering_id: str, at: int, unique: str = "u", partition: int = 0, **state: int) -> Loaded:
    return Loaded(partition, ScheduleEnvelope(TaskKey(ordering_id, at, unique), "t"), **state)


def keys(tasks: list[Loaded]) -> list[tuple[str, int]]:
    return [(t.key.ordering_id, t.key.scheduled_ms) for t in tasks]


def test_one_task_per_ordering_id_in_schedule_order() -> None:
    table = Timetable()
    for task in [loaded("a", 20), loaded("a", 10), loaded("b", 15), loaded("a", 30)]:
        table.add(task)

    assert keys(table.take_due(100)) == [("a", 10), ("b", 15)]
    assert table.take_due(100) == []  # a and b are both in flight
    table.remove(TaskKey("a", 10, "u"))
    assert keys(table.take_due(100)) == [("a", 20)]


def test_nothing_is_released_before_it_is_due() -> None:
    table = Timetable()
    table.add(loaded("a", 50))
    assert table.take_due(49) == []
    assert table.next_due_ms() == 50
    assert keys(table.take_due(50)) == [("a", 50)]


def test_an_in_flight_ordering_id_does_not_hold_back_others() -> None:
    table = Timetable()
    table.add(loaded("stuck", 1))
    table.add(loaded("stuck", 2))
    table.take_due(10)
    table.add(loaded("other", 5))
    assert keys(table.take_due(10)) == [("other", 5)]


def test_retry_keeps_the_ordering_id_blocked_until_the_backoff_ends() -> None:
    table = Timetable()
    table.add(loaded("a", 1))
    table.add(loaded("a", 2))
    [first] = table.take_due(10)
    table.retry_later(first.key, not_before_ms=100)
    assert table.take_due(99) == []
    assert keys(table.take_due(100)) == [("a", 1)]


def test_a_leased_task_blocks_its_ordering_id_until_the_lease_ends() -> None:
    table = Timetable()
    table.add(loaded("a", 1, lease_until_ms=500))
    table.add(loaded("a", 2))
    assert table.take_due(499) == []
    assert keys(table.take_due(500)) == [("a", 1)]


def test_blocked_ordering_id_stays_blocked_until_removed() -> None:
    table = Timetable()
    table.add(loaded("a", 1))
    table.add(loaded("a", 2))
    [first] = table.take_due(10)
    table.block(first.key)
    assert table.take_due(10**9) == []
    table.remove(first.key)
    assert keys(table.take_due(10**9)) == [("a", 2)]


def test_same_key_replaces_unless_in_flight() -> None:
    table = Timetable()
    table.add(loaded("a", 1))
    assert table.add(loaded("a", 1)) is True
    assert len(table) == 1
    table.take_due(10)
    assert table.add(loaded("a", 1)) is False


def test_drop_partitions_forgets_their_tasks() -> None:
    table = Timetable()
    table.add(loaded("a", 1, partition=0))
    table.add(loaded("b", 1, partition=1))
    assert table.drop_partitions([0]) == 1
    assert (table.count(0), table.count(1)) == (0, 1)
    assert keys(table.take_due(10)) == [("b", 1)]


def test_random_workload_keeps_order_and_never_overlaps() -> None:
    rng = random.Random(7)
    table = Timetable()
    expected: dict[str, list[int]] = {}
    for n in range(2000):
        ordering_id = f"o{rng.randrange(30)}"
        at = rng.randrange(1000)
        table.add(loaded(ordering_id, at, unique=str(n)))
        expected.setdefault(ordering_id, []).append(at)
    ran: dict[str, list[int]] = {}
    now = 0
    while len(table):
        now += rng.randrange(20)
        running = table.take_due(now)
        assert len({t.key.ordering_id for t in running}) == len(running)
        for task in running:
            assert task.key.scheduled_ms <= now
            ran.setdefault(task.key.ordering_id, []).append(task.key.scheduled_ms)
            table.remove(task.key)
    assert ran == {o: sorted(ats) for o, ats in expected.items()}


def test_awaiting_is_every_loaded_task_with_a_lease() -> None:
    table = Timetable()
    table.add(loaded("a", 1, lease_until_ms=50))  # released by a previous owner
    table.add(loaded("b", 1))
    table.add(loaded("c", 1))
    assert keys(table.awaiting()) == [("a", 1)]
    taken = table.take_due(10)
    assert keys(taken) == [("b", 1), ("c", 1)]
    for task in taken:  # what the engine does once it sent them
        task.lease_until_ms = 1000
    assert sorted(keys(table.awaiting())) == [("a", 1), ("b", 1), ("c", 1)]
    table.retry_later(taken[0].key, 500)  # its lease cleared
    table.remove(taken[1].key)
    table.add(loaded("a", 1))  # a new version of a, without a lease
    assert keys(table.awaiting()) == []
    table.drop_partitions([0])
    assert table.awaiting() == []


def test_awaiting_follows_a_random_workload() -> None:
    rng = random.Random(11)
    table = Timetable()
    now = 0
    for n in range(3000):
        now += rng.randrange(5)
        action = rng.random()
        if action < 0.4:
            lease = rng.choice([0, 0, now + rng.randrange(100)])
            ordering = rng.randrange(40)  # an ordering id lives in one partition
            table.add(loaded(f"o{ordering}", rng.randrange(now + 200), unique=str(n % 300),
                             partition=ordering % 3, lease_until_ms=lease))
        elif action < 0.7:
            for task in table.take_due(now, limit=5):
                if rng.random() < 0.8:
                    task.lease_until_ms = now + 100
                else:
                    table.defer(task.key, now + 10)
        elif action < 0.9:
            in_flight = table.in_flight()
            if in_flight:
                task = rng.choice(in_flight)
                if rng.random() < 0.5:
                    table.remove(task.key)
                else:
                    table.retry_later(task.key, now + 20)
        elif action < 0.92:
            table.drop_partitions([rng.randrange(3)])
        full_scan = {id(task) for partition in range(3) for task in table.partition_tasks(partition)
                     if task.lease_until_ms > 0}
        assert {id(task) for task in table.awaiting()} == full_scan


def test_a_task_looked_at_again_is_taken_ahead_of_its_due_time_from_then() -> None:
    """What defer() does not do: a deferred task waits for its due time, whatever the look
    ahead (a task the release gate put back 50 ms was otherwise marked only once due)."""
    table = Timetable()
    task = loaded("a", 1_000)
    table.add(task)
    assert table.take_due(500, ahead_ms=500) == [task]
    table.look_again(task.key, 550)
    assert table.next_take_ms(300) == 550
    assert table.take_due(549, ahead_ms=500) == []
    assert table.take_due(550, ahead_ms=500) == [task]  # 450 ms before it is due
    table.defer(task.key, 600)
    assert table.next_take_ms(300) == 1_000
    assert table.take_due(600, ahead_ms=500) == []


def test_a_look_again_of_a_task_gone_meanwhile_takes_the_next_head_at_its_own_time() -> None:
    table = Timetable()
    first, second = loaded("a", 1_000), loaded("a", 5_000, "v")
    table.add(first)
    table.add(second)
    assert table.take_due(500, ahead_ms=500) == [first]
    table.look_again(first.key, 550)
    table.remove(first.key)
    assert table.take_due(550, ahead_ms=500) == []
    assert table.take_due(4_500, ahead_ms=500) == [second]
