"""A local Spark session's shuffles are sized for the cores it runs on, not for a cluster."""

from __future__ import annotations

import os

import pytest

from celery_scheduler.spark.session import local_shuffle_partitions


@pytest.mark.parametrize(("master", "partitions"), [
    ("local[4]", 8), ("local[1]", 2), ("local", 2), ("local[3,2]", 6),
    ("local[*]", max(2, 2 * (os.cpu_count() or 1))), (None, max(2, 2 * (os.cpu_count() or 1)))])
def test_two_shuffle_partitions_per_local_core(master: str | None, partitions: int) -> None:
    assert local_shuffle_partitions(master) == partitions
