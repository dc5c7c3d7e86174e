"""Scenario 1c: bulk scheduling from a Spark DataFrame, against one process's batched calls.

A DataFrame of rows (generated in Spark, so the driver's Python does not build them) is
scheduled with ``celery_scheduler.spark.schedule_dataframe`` on local Spark; the same run
measures the single-process batched form (``schedule(..., wait=False)`` then ``flush``, as
in scenario 1) on the same stack, for the ratio.
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

from benchmarks.context import Context
from benchmarks.harness import log, stack
from benchmarks.report import Section
from benchmarks.schedule import ORDERING_IDS, batched_rate, due_times
from benchmarks.stats import Figure

RUNS = 3  # of the bulk job and the one process beside it, in turn (full runs)

__all__ = ["run"]


def _bulk(app: Any, rows: int, at: float) -> float:
    """Seconds to schedule *rows* rows from a DataFrame, Kafka's acknowledgements included."""
    from celery_scheduler.spark import schedule_dataframe, session

    spark = session("local[2]", "celery_scheduler bench",
                    {"spark.driver.memory": "2g", "spark.sql.shuffle.partitions": "4"})
    try:
        df = spark.range(rows).selectExpr(
            f"concat('o', id % {ORDERING_IDS}) AS ordering_id", "id AS seq",
            f"CAST({at} AS TIMESTAMP) AS due", f"CAST({at} AS DOUBLE) AS due_s")
        schedule_dataframe(df.limit(100), app.record, at="due",
                           args=["ordering_id", "seq", "due_s"])  # start-up and connectors
        started = time.perf_counter()
        result = schedule_dataframe(df, app.record, at="due", args=["ordering_id", "seq", "due_s"])
        took = time.perf_counter() - started
    finally:
        spark.stop()
        _end_jvm()
    if (result.accepted, result.rejected_count) != (rows, 0):
        raise RuntimeError(f"bulk job: {result.accepted} accepted, {result.rejected_count} refused")
    log(f"{rows:,} rows bulk-scheduled in {took:.1f}s")
    return took


def _end_jvm() -> None:
    """End the JVM that ``spark.stop()`` leaves running for the life of the process: with it
    goes Spark's cached Kafka producer, which would keep asking for the (deleted) topic's
    metadata and take CPU from every scenario after this one."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    process = getattr(gateway, "proc", None)
    gateway.shutdown()
    SparkContext._gateway = None
    SparkContext._jvm = None
    if process is not None:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run(ctx: Context) -> list[Section]:
    rows = ctx.pick(50_000, 1_000_000)
    section = Section("1c", "Bulk scheduling from a Spark DataFrame (local Spark, 2 cores)")
    took, single = [], []
    for _ in range(ctx.pick(1, RUNS)):  # the bulk job, then the one process, in turn
        with stack(ctx.tmp) as s:
            app = s.use_client()
            at = time.time() + 7 * 24 * 3600
            took.append(_bulk(app, rows, at))
            single.append(batched_rate(app, due_times(at, ctx.pick(10_000, 30_000))))
    rates = [rows / t for t in took]
    full = rows == 1_000_000
    section.add(f"{rows:,} rows: time, scheduled and acknowledged", Figure.of(took, "s", 1),
                "≤ 60 s in every run" if full else "", max(took) <= 60 if full else None)
    section.add("bulk rate", Figure.of(rates, "rows/s"))
    section.add("one process, batched schedule(..., wait=False) + flush", Figure.of(single, "/s"))
    section.add("bulk rate / one process's batched rate, run by run",
                Figure.of([r / one for r, one in zip(rates, single, strict=True)], "%"))
    section.method = [
        f"{rows:,} rows generated in Spark (spark.range: {ORDERING_IDS} ordering ids, due 7 days "
        "ahead), scheduled with schedule_dataframe on local[2]: each row validated and encoded "
        "by the package's own code on the executors, written with Spark's Kafka sink; the time "
        "runs from the call to its return, after Kafka acknowledged every record. A first job "
        "of 100 rows starts the JVM and resolves the connectors beforehand.",
        "one process: scenario 1's batched form (a due time of its own a call), on the same "
        f"topic, in the same run. {ctx.pick(1, RUNS)} run(s), each on a fresh topic.",
    ]
    return [section]
