"""When a dispatcher without partitions takes its Kafka consumer to be out of the group."""

from __future__ import annotations

from celery_scheduler.dispatcher.membership import Membership
from celery_scheduler.store.base import Lease

NOW_MS = 1_800_000_000_000


def _membership(started: float = 100.0) -> Membership:
    return Membership(3, started, unassigned_seconds=20, orphan_seconds=10, check_seconds=5)


def _lease(partition: int, expires_ms: int) -> Lease:
    return Lease(partition, "other", 1, expires_ms)


def test_leases_are_read_only_after_long_enough_without_a_partition_and_not_too_often() -> None:
    membership = _membership(started=100.0)
    assert not membership.due(119.9)
    assert membership.due(120.0)
    assert not membership.due(124.9)
    assert membership.due(125.0)


def test_holding_a_partition_stops_the_clock_and_losing_the_last_one_starts_it() -> None:
    membership = _membership(started=100.0)
    membership.assigned([0, 1], 101.0)
    assert membership.unassigned_for(200.0) == 0.0
    assert not membership.due(200.0)
    membership.revoked([0], 201.0)
    assert not membership.due(300.0)  # still holds partition 1
    membership.revoked([1], 301.0)
    assert membership.unassigned_for(311.0) == 10.0
    assert not membership.due(320.9)
    assert membership.due(321.0)


def test_a_partition_is_orphaned_without_a_lease_or_well_past_its_end() -> None:
    membership = _membership()
    leases = [_lease(0, NOW_MS + 5_000),      # held
              _lease(1, NOW_MS - 9_000),      # just over: its owner may be renewing it late
              _lease(7, 0)]                   # not a partition of the topic (3 of them)
    assert membership.orphaned(leases, NOW_MS) == [2]
    assert membership.orphaned(leases, NOW_MS + 2_000) == [1, 2]


def test_every_lease_held_means_nothing_is_orphaned() -> None:
    membership = _membership()
    assert membership.orphaned([_lease(n, NOW_MS + 1) for n in range(3)], NOW_MS) == []


def test_a_new_consumer_is_given_as_long_as_a_fresh_start() -> None:
    membership = _membership(started=100.0)
    assert membership.due(130.0)
    membership.rejoined(130.0)
    assert membership.rejoins == 1
    assert not membership.due(149.9)
    assert membership.due(150.0)


def _lost_membership() -> Membership:
    membership = Membership(6, 100.0, unassigned_seconds=20, orphan_seconds=10, check_seconds=5,
                            lost_hold_seconds=20)
    membership.assigned([0, 1, 2], 100.0)
    membership.lost([0, 1, 2], 110.0)
    return membership


def test_lost_partitions_are_kept_while_leased_and_not_counted_as_held() -> None:
    membership = _lost_membership()
    assert membership.kept == [0, 1, 2]
    assert membership.lost_to_give_up(129.9, lambda number: True) == []
    assert membership.unassigned_for(125.0) == 15.0  # not held by the consumer


def test_the_first_assignment_after_a_loss_keeps_what_it_brings_back_and_gives_up_the_rest() -> None:
    membership = _lost_membership()
    assert membership.assigned([1, 2, 4], 116.0) == [0]
    assert membership.kept == []
    # kept for good: no deadline left on partitions assigned again
    assert membership.lost_to_give_up(500.0, lambda number: False) == []


def test_an_empty_assignment_after_a_loss_gives_every_lost_partition_up() -> None:
    membership = _lost_membership()
    assert membership.assigned([], 116.0) == [0, 1, 2]


def test_a_lost_partition_is_given_up_once_its_lease_is_gone_or_it_was_kept_long_enough() -> None:
    membership = _lost_membership()
    assert membership.lost_to_give_up(111.0, lambda number: number != 1) == [1]
    assert membership.lost_to_give_up(129.9, lambda number: True) == []
    assert membership.lost_to_give_up(130.0, lambda number: True) == [0, 2]
    assert membership.kept == []


def test_a_new_consumer_gives_up_what_the_old_one_lost() -> None:
    membership = _lost_membership()
    assert membership.rejoined(115.0) == [0, 1, 2]
    assert membership.kept == []


def test_a_partition_leased_here_but_neither_assigned_nor_kept_is_handed_over_in_time() -> None:
    """A revocation that did not reach the engine left a partition leased (and renewed) here
    while Kafka gave its records to another dispatcher, whose tasks waited for the lease."""
    membership = Membership(3, 100.0, stray_seconds=45)
    membership.assigned([0, 1], 100.0)
    membership.lost([1], 101.0)  # kept while leased: not a stray
    assert membership.strays([0, 1, 2], 101.0) == []
    assert membership.strays([0, 1, 2], 145.9) == []
    assert membership.strays([0, 1, 2], 146.0) == [2]
    assert membership.strays([0, 1], 147.0) == []
    membership.lost_to_give_up(200.0, lambda number: True)  # kept long enough: given up
    assert membership.strays([0, 1], 200.0) == []
    assert membership.strays([0, 1], 245.0) == [1]


def test_a_partition_assigned_again_in_time_is_no_stray() -> None:
    membership = Membership(3, 100.0, stray_seconds=45)
    assert membership.strays([2], 100.0) == []
    membership.assigned([2], 140.0)
    assert membership.strays([2], 150.0) == []
    membership.revoked([2], 151.0)
    assert membership.strays([2], 152.0) == []  # its clock starts again
    assert membership.strays([2], 197.0) == [2]
