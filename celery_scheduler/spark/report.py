"""The operator's report, read from Cassandra: how late tasks finish, what fails, what waits.

::

    result = report(spark, get_settings(app), "report/")   # Parquet tables + report/report.html

Tables (Parquet, one directory each under the output directory):

- ``lateness``: finished tasks (succeeded or failed) with their scheduled time, when they
  were first released, when their last attempt started and ended on the worker, when the
  dispatcher recorded them finished, the lateness in seconds (scheduled to recorded) and its
  parts (``release_s``: scheduled to first release; ``wait_s``: released to started, the
  broker and the worker's queue, and any retries; ``run_s``: the last attempt's run),
  task, partition and hour;
- ``by_task``: per task name, how many finished, succeeded, failed, were retried, the
  failure and retry rates and lateness percentiles;
- ``top_errors``: the most frequent last errors of failed or retried tasks;
- ``blocked``: ordering ids held by a task blocked after its last attempt
  (``scheduler_on_exhausted = "block"``);
- ``overdue``: the oldest tasks still waiting whose time has passed.

``report.html`` shows the same with charts (PNG, inline), so the page is one file to open.
Lateness here runs from the scheduled time to the completion written to the store, which
includes the run itself; its parts show where the time went. A part is missing (null) where
its times are: tasks finished by an earlier version, or (the first release) released by
another dispatcher before a takeover. Statuses are kept ``scheduler_status_ttl`` seconds
(7 days).
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from celery_scheduler.config import Settings

__all__ = ["Report", "report"]

TOP = 20  # rows of the top-errors, blocked and overdue tables
QUANTILES = (0.5, 0.9, 0.99)
# The parts of lateness, in the order they happen, and what the charts call them.
PARTS = {"release_s": "scheduled to released", "wait_s": "released to started",
         "run_s": "the run"}


@dataclass(frozen=True)
class Report:
    """Headline figures of a report; the tables are in *output*."""

    output: Path
    finished: int
    succeeded: int
    failed: int
    retried: int  # finished after more than one attempt
    lateness_p50: float | None  # seconds
    lateness_p99: float | None
    release_p99: float | None  # scheduled to first release
    wait_p99: float | None  # first release to the last attempt's start
    run_p99: float | None  # the last attempt's run
    blocked: int
    overdue: int  # waiting, and due before the report's time

    @property
    def html(self) -> Path:
        return self.output / "report.html"


def _table(spark: Any, settings: Settings, name: str, host: str | None) -> Any:
    return (spark.read.format("org.apache.spark.sql.cassandra")
            .option("spark.cassandra.connection.host", host or settings.cassandra_contact_points[0])
            .option("spark.cassandra.connection.port", str(settings.cassandra_port))
            .options(keyspace=settings.cassandra_keyspace, table=name).load())


def report(spark: Any, settings: Settings, output: str | Path, *, cassandra_host: str | None = None,
           now: dt.datetime | None = None) -> Report:
    """Read the status and schedule tables, write the tables and ``report.html`` to *output*."""
    from pyspark.sql import functions as F

    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    when = now or dt.datetime.now(dt.timezone.utc)
    status = _table(spark, settings, "key_status", cassandra_host)
    def seconds(start: str, end: str) -> Any:
        return F.col(end).cast("double") - F.col(start).cast("double")

    finished = (status.filter(F.col("state").isin("succeeded", "failed"))
                .select("ordering_id", "unique_key", "task", "partition", "state", "attempts",
                        "last_error", F.col("at").alias("scheduled"),
                        F.col("released_at").alias("released"), F.col("started_at").alias("started"),
                        F.col("finished_at").alias("ended"), F.col("updated_at").alias("finished"))
                .withColumn("lateness_s", seconds("scheduled", "finished"))
                .withColumn("release_s", seconds("scheduled", "released"))
                .withColumn("wait_s", seconds("released", "started"))
                .withColumn("run_s", seconds("started", "ended"))
                .withColumn("hour", F.date_trunc("hour", F.col("scheduled")))
                .persist())
    try:
        by_task = finished.groupBy("task").agg(
            F.count("*").alias("finished"),
            F.sum((F.col("state") == "succeeded").cast("int")).alias("succeeded"),
            F.sum((F.col("state") == "failed").cast("int")).alias("failed"),
            F.sum((F.col("attempts") > 1).cast("int")).alias("retried"),
            F.percentile_approx("lateness_s", list(QUANTILES)).alias("lateness_quantiles"),
        ).withColumn("failure_rate", F.col("failed") / F.col("finished")).withColumn(
            "retry_rate", F.col("retried") / F.col("finished")).orderBy("task")
        errors = (finished.filter(F.col("last_error").isNotNull()
                                  & ((F.col("state") == "failed") | (F.col("attempts") > 1)))
                  .groupBy("task", "last_error").count().orderBy(F.col("count").desc()).limit(TOP))
        schedule = _table(spark, settings, "schedule", cassandra_host).filter(
            F.col("envelope").isNotNull())
        blocked = (schedule.filter(F.col("blocked"))
                   .select("ordering_id", "task", F.col("at").alias("scheduled"), "attempts")
                   .orderBy("scheduled"))
        # due and not running (a released task's lease is in the future)
        waiting = schedule.filter(~F.coalesce(F.col("blocked"), F.lit(False))
                                  & (F.col("at") < F.lit(when))
                                  & (F.col("lease_until").isNull() | (F.col("lease_until") < F.lit(when))))
        overdue = (waiting.select("ordering_id", "unique_key", "task", "partition",
                                  F.col("at").alias("scheduled"), "attempts")
                   .withColumn("overdue_s", F.lit(when.timestamp()) - F.col("scheduled").cast("double"))
                   .orderBy("scheduled").limit(TOP))
        tables = {"lateness": finished, "by_task": by_task, "top_errors": errors,
                  "blocked": blocked, "overdue": overdue}
        for name, table in tables.items():
            table.write.mode("overwrite").parquet(str(out / name))
        counts = finished.agg(
            F.count("*").alias("n"), F.sum((F.col("state") == "succeeded").cast("int")).alias("ok"),
            F.sum((F.col("attempts") > 1).cast("int")).alias("retried"),
            F.percentile_approx("lateness_s", [0.5, 0.99]).alias("q"),
            *(F.percentile_approx(part, 0.99).alias(part) for part in PARTS)).first()
        quantiles = counts["q"] or [None, None]
        result = Report(out, counts["n"], counts["ok"] or 0, counts["n"] - (counts["ok"] or 0),
                        counts["retried"] or 0, quantiles[0], quantiles[1],
                        counts["release_s"], counts["wait_s"], counts["run_s"], blocked.count(),
                        waiting.count())
        _write_html(result, when, finished, by_task.collect(), errors.collect(),
                    blocked.limit(TOP).collect(), overdue.collect())
        return result
    finally:
        finished.unpersist()


def _png(figure: Any) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    return f"<img alt='' src='data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}'>"


def _charts(finished: Any, by_task: list[Any]) -> list[str]:
    """Lateness histogram and per-hour p99, failure rate per task: PNGs made with matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot
    from pyspark.sql import functions as F

    charts = []
    lateness = [row["lateness_s"] for row in finished.select("lateness_s").limit(200_000).collect()
                if row["lateness_s"] is not None]
    if lateness:
        figure, axes = pyplot.subplots(figsize=(7, 3))
        axes.hist(lateness, bins=50, color="#4a7bd0")
        axes.set_xlabel("seconds from the scheduled time to completion")
        axes.set_ylabel("tasks")
        axes.set_title("Lateness of finished tasks")
        charts.append(_png(figure))
        pyplot.close(figure)
    parts = finished.agg(*(F.percentile_approx(part, list(QUANTILES)).alias(part)
                           for part in PARTS)).first()
    known = {part: parts[part] for part in PARTS if parts[part]}
    if known:
        figure, axes = pyplot.subplots(figsize=(7, 2.5))
        for offset, (quantile, color) in enumerate(zip(QUANTILES, ("#9ab8ea", "#4a7bd0", "#1f3f7a"),
                                                       strict=True)):
            axes.barh([i + offset * 0.27 for i in range(len(known))],
                      [values[offset] for values in known.values()], height=0.27, color=color,
                      label=f"p{round(quantile * 100)}")
        axes.set_yticks([i + 0.27 for i in range(len(known))], [PARTS[part] for part in known])
        axes.invert_yaxis()
        axes.set_xlabel("seconds")
        axes.set_title("Where the lateness goes")
        axes.legend()
        charts.append(_png(figure))
        pyplot.close(figure)
    hourly = (finished.groupBy("hour").agg(F.percentile_approx("lateness_s", 0.99).alias("p99"),
                                           F.count("*").alias("n")).orderBy("hour").collect())
    if len(hourly) > 1:
        figure, axes = pyplot.subplots(figsize=(7, 3))
        axes.plot([row["hour"] for row in hourly], [row["p99"] for row in hourly], marker="o")
        axes.set_ylabel("p99 lateness, s")
        axes.set_title("p99 lateness by scheduled hour")
        figure.autofmt_xdate()
        charts.append(_png(figure))
        pyplot.close(figure)
    if by_task:
        figure, axes = pyplot.subplots(figsize=(7, 0.5 + 0.35 * len(by_task)))
        axes.barh([row["task"] for row in by_task], [row["failure_rate"] for row in by_task],
                  color="#b00020")
        axes.set_xlabel("share of finished tasks that failed")
        axes.set_title("Failure rate by task")
        charts.append(_png(figure))
        pyplot.close(figure)
    return charts


def _rows(headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape('' if c is None else str(c))}</td>" for c in row)
                   + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} s"


def _write_html(result: Report, when: dt.datetime, finished: Any, by_task: list[Any],
                errors: list[Any], blocked: list[Any], overdue: list[Any]) -> None:
    tasks = [[r["task"], r["finished"], r["succeeded"], r["failed"], f"{r['failure_rate']:.1%}",
              f"{r['retry_rate']:.1%}", *(_seconds(q) for q in (r["lateness_quantiles"] or []))]
             for r in by_task]
    page = f"""<!doctype html><html><head><meta charset='utf-8'><title>celery_scheduler report</title>
<style>body {{ font-family: system-ui, sans-serif; margin: 2rem; color: #222; }}
table {{ border-collapse: collapse; margin: 1rem 0; }} th, td {{ border: 1px solid #ccc;
padding: .3rem .7rem; text-align: left; }} th {{ background: #f2f2f2; }}</style></head><body>
<h1>celery_scheduler report</h1><p>{html.escape(when.isoformat())}: {result.finished} task(s)
finished ({result.succeeded} succeeded, {result.failed} failed, {result.retried} after a retry);
lateness p50 {_seconds(result.lateness_p50)}, p99 {_seconds(result.lateness_p99)} (p99 of its
parts: scheduled to released {_seconds(result.release_p99)}, released to started
{_seconds(result.wait_p99)}, the run {_seconds(result.run_p99)});
{result.blocked} blocked; {result.overdue} waiting past their time.</p>
{''.join(_charts(finished, by_task))}
<h2>By task</h2>{_rows(["task", "finished", "succeeded", "failed", "failure rate", "retry rate",
                        "p50", "p90", "p99"], tasks)}
<h2>Top errors</h2>{_rows(["task", "last error", "tasks"],
                          [[r["task"], r["last_error"], r["count"]] for r in errors])}
<h2>Blocked ordering ids</h2>{_rows(["ordering id", "task", "scheduled", "attempts"],
                                    [[r["ordering_id"], r["task"], r["scheduled"], r["attempts"]]
                                     for r in blocked])}
<h2>Oldest overdue</h2>{_rows(["ordering id", "uniqueness key", "task", "partition", "scheduled",
                               "attempts", "overdue"],
                              [[r["ordering_id"], r["unique_key"], r["task"], r["partition"],
                                r["scheduled"], r["attempts"], _seconds(r["overdue_s"])]
                               for r in overdue])}
</body></html>"""
    result.html.write_text(page)
