from __future__ import annotations

import pytest

from celery_scheduler.partitioner import murmur2, partition_for

# Apache Kafka's UtilsTest.testMurmur2 vectors (Java signed ints).
JAVA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
    b"": 275646681,
}


@pytest.mark.parametrize(("data", "expected"), JAVA_VECTORS.items())
def test_murmur2_matches_kafka_java_client(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


def test_partition_uses_positive_hash_modulo_count() -> None:
    assert partition_for(b"foobar", 50) == 16
    assert partition_for("foobar", 50) == 16


def test_unicode_keys_hash_their_utf8_bytes() -> None:
    assert partition_for("ключ-é", 12) == partition_for("ключ-é".encode(), 12)


@pytest.mark.parametrize("count", [0, -3])
def test_partition_count_must_be_positive(count: int) -> None:
    with pytest.raises(ValueError, match=str(count)):
        partition_for("k", count)
