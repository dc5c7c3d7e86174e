"""Where a key's status row lives follows from the key and the keyspace's two numbers."""

from __future__ import annotations

import pytest

from celery_scheduler.keys import TaskKey
from celery_scheduler.partitioner import partition_for
from celery_scheduler.store.status_layout import StatusLayout

NOW = 1_893_456_000_000  # 2030-01-01T00:00:00Z, a multiple of ten minutes


def test_a_keys_shard_is_its_ordering_ids_partition_for_the_keyspaces_count() -> None:
    layout = StatusLayout(12)
    for ordering_id in ("customer-42", "a", "é", ""):
        assert layout.shard(ordering_id) == partition_for(ordering_id, 12)
    assert StatusLayout(5).shard("customer-42") == partition_for("customer-42", 5)


def test_the_primary_key_orders_its_values_as_the_table_does() -> None:
    key = TaskKey("customer-42", NOW + 599_999, "welcome")
    assert StatusLayout(12, 600).primary_key(key) == (
        partition_for("customer-42", 12), NOW // 600_000, NOW + 599_999, "customer-42", "welcome")
    assert StatusLayout(12, 600).slot(NOW + 600_000) == NOW // 600_000 + 1
    assert StatusLayout(12, 60).slot(NOW - 1) == NOW // 60_000 - 1


def test_keys_are_grouped_by_cassandra_partition_in_the_order_given() -> None:
    layout = StatusLayout(3, 600)
    keys = [TaskKey(f"o{i % 7}", NOW + i * 100_000, f"u{i}") for i in range(40)]

    groups = layout.partitions(keys)

    assert sorted(k for group in groups.values() for k in group) == sorted(keys)
    for (shard, slot), group in groups.items():
        assert all(layout.shard(k.ordering_id) == shard and layout.slot(k.scheduled_ms) == slot
                   for k in group)
        assert group == [k for k in keys if k in group]  # order kept
    assert len(groups) < len(keys)


@pytest.mark.parametrize("shards, slot_seconds", [(0, 600), (12, 0), (True, 600), (12, 1.5)])
def test_a_layout_needs_positive_integers(shards: object, slot_seconds: object) -> None:
    with pytest.raises(ValueError, match="positive integer"):
        StatusLayout(shards, slot_seconds)  # type: ignore[arg-type]
