"""Kafka's Java-client partitioner, so every producer agrees on where an ordering id lives.

The Java client (and librdkafka's ``murmur2_random``) hash a non-null key with MurmurHash2
(seed ``0x9747b28c``), clear the sign bit and take the remainder by the partition count.
Python's ``hash()`` is salted per process and confluent-kafka's default partitioner is
CRC32-based, so neither may be used to predict a partition.
"""

from __future__ import annotations

__all__ = ["murmur2", "partition_for"]

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Return Kafka's ``Utils.murmur2`` of *data* as a signed 32-bit integer.

    >>> murmur2(b"21")
    -973932308
    """
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length & ~3
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length & 3
    if rest == 3:
        h ^= data[whole + 2] << 16
    if rest >= 2:
        h ^= data[whole + 1] << 8
    if rest >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: str | bytes, partitions: int) -> int:
    """Return the partition Kafka's Java client picks for *key* among *partitions*.

    >>> partition_for("customer-42", 12)
    9
    """
    if partitions <= 0:
        raise ValueError(f"partitions must be positive, got {partitions!r}")
    data = key.encode("utf-8") if isinstance(key, str) else key
    return (murmur2(data) & 0x7FFFFFFF) % partitions
