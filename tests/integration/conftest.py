from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.dispatch_fixtures import namespaces, schedule, scheduler  # noqa: F401
from tests.integration.private_redis import private_redis  # noqa: F401


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """Local Spark (two cores) with the jobs' connectors, for one test module."""
    from celery_scheduler.spark import session

    spark = session("local[2]", "celery_scheduler tests",
                    {"spark.sql.shuffle.partitions": "4", "spark.driver.memory": "1g"})
    yield spark
    spark.stop()
    gc.collect()  # PySpark's gateway sockets, here, where their warnings are ignored
