"""Writes grouped into requests: each bound statement weighed, and writes packed into as few
unlogged batches as Cassandra takes without a warning, those of one Cassandra partition
together (:func:`packed`). Pure: the session (:mod:`celery_scheduler.store.cqlsession`)
sends what this groups.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, NamedTuple

__all__ = ["Write", "packed", "weight_of"]

# Writes share a request up to these limits (see packed): Cassandra warns of an unlogged
# batch over 10 partitions or 5 KiB, and refuses one over 50 KiB. It counts neither against
# a batch whose writes all go to one partition: those are bounded by ALONE_BYTES instead.
PACK_PARTITIONS = 10
PACK_BYTES = 4096
PACK_STATEMENTS = 100
ALONE_BYTES = 32768
# A write's weight, an upper bound of the size Cassandra counts for it: the bytes of its
# text and blob values, CELL_WEIGHT for each value (a cell's timestamp and flags; a null
# is a tombstone cell) and STATEMENT_WEIGHT for the row. Cassandra counted 271-275 bytes
# for a pending status (14 values, 30 bytes of text) and 325-329 for a final one (15, 30).
STATEMENT_WEIGHT = 16
CELL_WEIGHT = 20


class Write(NamedTuple):
    """One bound statement, the Kafka partition whose fence stamps it, and the Cassandra
    partition it writes ((table, routing key)), which requests are grouped by.

    A tuple: the dispatcher makes two to four a task, and a frozen dataclass's ``__init__``
    (``object.__setattr__`` per field) took 0.44 µs against a tuple's 0.19."""

    partition: int
    target: Hashable
    weight: int
    statement: Any


def packed(writes: Sequence[Write]) -> list[list[Write]]:
    """*writes* grouped into as few requests as they fit, those of one Cassandra partition together.

    Cassandra applies the writes of one batch to one partition as one mutation, so a release
    of a hundred tasks due in one minute is a few mutations, not two hundred. A request of
    several Cassandra partitions holds at most PACK_PARTITIONS of them, PACK_BYTES of weight
    and PACK_STATEMENTS statements. The writes of one partition too heavy to share a request
    go in requests of their own (at most PACK_STATEMENTS statements and ALONE_BYTES each),
    as does a write heavier than PACK_BYTES.
    """
    requests: list[list[Write]] = []
    by_target: dict[Hashable, list[Write]] = {}
    for write in writes:
        if write.weight >= PACK_BYTES:
            requests.append([write])
        else:
            by_target.setdefault(write.target, []).append(write)
    current: list[Write] = []
    size = targets = 0
    for group in by_target.values():
        if sum(write.weight for write in group) > PACK_BYTES:
            requests.extend(_alone(group))
            continue
        if current and targets >= PACK_PARTITIONS:
            requests.append(current)
            current, size, targets = [], 0, 0
        targets += 1
        for write in group:
            if current and (size + write.weight > PACK_BYTES or len(current) >= PACK_STATEMENTS):
                requests.append(current)
                current, size, targets = [], 0, 1
            current.append(write)
            size += write.weight
    if current:
        requests.append(current)
    return requests


def _alone(group: list[Write]) -> list[list[Write]]:
    """The writes of one Cassandra partition in requests of their own."""
    requests: list[list[Write]] = []
    current: list[Write] = []
    size = 0
    for write in group:
        if current and (size + write.weight > ALONE_BYTES or len(current) >= PACK_STATEMENTS):
            requests.append(current)
            current, size = [], 0
        current.append(write)
        size += write.weight
    if current:
        requests.append(current)
    return requests


def weight_of(params: Sequence[Any]) -> int:
    weight = STATEMENT_WEIGHT + CELL_WEIGHT * len(params)
    # A loop testing exact types: half the time of a generator with isinstance, for every
    # write. The store's values are plain str and bytes (decoded envelopes, enum values).
    for value in params:
        kind = type(value)
        if kind is str or kind is bytes:
            weight += len(value)
    return weight
