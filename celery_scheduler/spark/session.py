"""A SparkSession with the connectors the jobs need, resolved from Maven Central once."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["CASSANDRA_CONNECTOR", "kafka_connector", "local_shuffle_partitions", "session"]

# The Cassandra connector of Spark 3.5 (Scala 2.12), for the jobs that read the schedule.
CASSANDRA_CONNECTOR = "com.datastax.spark:spark-cassandra-connector_2.12:3.5.1"


def kafka_connector() -> str:
    """Spark's Kafka source and sink, of the same version as the installed PySpark."""
    import pyspark

    return f"org.apache.spark:spark-sql-kafka-0-10_2.12:{pyspark.__version__}"


def _ivy_cache() -> str:
    base = os.environ.get("CELERY_SCHEDULER_CACHE") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "celery-scheduler")
    return str(Path(base) / "ivy")


def local_shuffle_partitions(master: str | None) -> int:
    """Shuffle partitions for a local master: two per core it runs on (``local[N]``, or all
    of the machine's for ``local`` and ``local[*]``)."""
    cores = os.cpu_count() or 1
    inside = (master or "local[*]").partition("[")[2].rstrip("]").split(",")[0]
    if inside.isdigit() and int(inside) > 0:
        cores = int(inside)
    elif master == "local":
        cores = 1
    return max(2, 2 * cores)


def session(master: str | None = None, app_name: str = "celery_scheduler",
            config: dict[str, str] | None = None) -> Any:
    """A SparkSession (local on all cores unless *master* is given) with the connectors."""
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:  # pragma: no cover - depends on the extra
        raise ImportError("the Spark jobs need the spark extra: "
                          "pip install 'celery-scheduler[spark]'") from exc
    builder = (SparkSession.builder.appName(app_name).master(master or "local[*]")
               .config("spark.jars.packages", f"{kafka_connector()},{CASSANDRA_CONNECTOR}")
               .config("spark.jars.ivy", _ivy_cache())
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.ui.enabled", "false"))
    if (master or "local").startswith("local"):
        # executors are this machine's: the same Python (a virtual environment's, say)
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        # Spark's 200 shuffle partitions are sized for a cluster: on one machine each stage
        # of a few thousand rows ran 200 tasks. Two per core, and adaptive execution
        # coalescing what is smaller still.
        builder = (builder.config("spark.sql.shuffle.partitions", str(local_shuffle_partitions(master)))
                   .config("spark.sql.adaptive.enabled", "true")
                   .config("spark.sql.adaptive.coalescePartitions.enabled", "true"))
    for name, value in (config or {}).items():
        builder = builder.config(name, value)
    return builder.getOrCreate()
