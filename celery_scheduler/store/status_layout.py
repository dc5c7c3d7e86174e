"""Where a task key's status row lives in Cassandra, worked out from the key alone.

``key_status`` is partitioned by (shard, slot): the shard is the ordering id's Kafka
partition for the partition count the keyspace was made with, and the slot is the
scheduled time's window of ``slot_seconds``. Keys of one Kafka partition due in the same
window share a Cassandra partition, so the dispatcher reads the statuses of a whole ingest
batch with a few requests (``(at, ordering_id, unique_key) IN ?``) instead of one a key.
Both numbers are written once, by ``scheduler init``, into ``status_layout``: every reader
(dispatchers, clients, the Spark jobs) must use the same, even after the topic is given
another partition count.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from celery_scheduler.keys import TaskKey
from celery_scheduler.partitioner import partition_for

__all__ = ["DEFAULT_SLOT_SECONDS", "StatusLayout", "StatusPrimaryKey"]

# Ten minutes: wide enough that an ingest batch's keys mostly share a slot, narrow enough
# that a slot of one shard stays a modest Cassandra partition at thousands of tasks a second.
DEFAULT_SLOT_SECONDS = 600


# (shard, slot, at, ordering_id, unique_key), in the order of key_status's primary key; at
# in milliseconds since the epoch, as a timestamp column takes it (see store.binding): a
# datetime made here and taken apart again when bound cost 1.5 µs of each status write.
StatusPrimaryKey = tuple[int, int, int, str, str]


@functools.lru_cache(maxsize=65_536)  # murmur2 in Python costs microseconds; ids repeat
def _shard(ordering_id: str, shards: int) -> int:
    return partition_for(ordering_id, shards)


@dataclass(frozen=True)
class StatusLayout:
    """The shard count and slot width of one keyspace's ``key_status`` table."""

    shards: int
    slot_seconds: int = DEFAULT_SLOT_SECONDS

    def __post_init__(self) -> None:
        for name in ("shards", "slot_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"a status layout's {name} must be a positive integer, got {value!r}")

    def shard(self, ordering_id: str) -> int:
        return _shard(ordering_id, self.shards)

    def slot(self, scheduled_ms: int) -> int:
        return scheduled_ms // (self.slot_seconds * 1000)

    def primary_key(self, key: TaskKey) -> StatusPrimaryKey:
        """The values of *key*'s row's primary key, in the table's order."""
        ms = key.scheduled_ms
        return (_shard(key.ordering_id, self.shards), ms // (self.slot_seconds * 1000), ms,
                key.ordering_id, key.uniqueness_key)

    def partitions(self, keys: Iterable[TaskKey]) -> dict[tuple[int, int], list[TaskKey]]:
        """*keys* by the Cassandra partition (shard, slot) their rows are in, in order."""
        grouped: defaultdict[tuple[int, int], list[TaskKey]] = defaultdict(list)
        width = self.slot_seconds * 1000
        for key in keys:
            grouped[(_shard(key.ordering_id, self.shards), key.scheduled_ms // width)].append(key)
        return dict(grouped)
