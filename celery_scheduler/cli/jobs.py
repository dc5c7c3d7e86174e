"""Batch jobs on Apache Spark, from the command line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from celery_scheduler.cli.group import _app, _fail, scheduler
from celery_scheduler.client import get_client
from celery_scheduler.errors import SchedulerError

MASTER = click.option("--master", default=None,
                      help="Spark master URL (default: local on every core)")


@scheduler.group(name="spark")
def spark_jobs() -> None:
    """Batch jobs on Apache Spark (the spark extra): bulk scheduling, report, audit, migration."""


@contextmanager
def _spark(master: str | None) -> Iterator[Any]:
    """A SparkSession for one job, stopped after it; a clear error without the spark extra."""
    try:
        from celery_scheduler.spark import session
    except ImportError as exc:
        raise click.ClickException(f"{exc}; pip install 'celery-scheduler[spark]'") from None
    spark = session(master)
    try:
        yield spark
    except SchedulerError as exc:
        _fail(exc)
    finally:
        spark.stop()


def _mapping(pairs: tuple[str, ...], what: str) -> dict[str, str]:
    mapped = {}
    for pair in pairs:
        name, sep, column = pair.partition("=")
        if not sep or not name or not column:
            raise click.BadParameter(f"{pair!r} is not NAME=COLUMN", param_hint=what)
        mapped[name] = column
    return mapped


@spark_jobs.command(name="schedule")
@click.argument("path")
@click.option("--task", "task_name", required=True, help="the scheduled task's Celery name")
@click.option("--format", "file_format", type=click.Choice(["parquet", "csv", "json"]),
              default="parquet", show_default=True)
@click.option("--at", required=True, help="the column of the scheduled time")
@click.option("--arg", "args", multiple=True, help="a column per positional argument, in order")
@click.option("--kwarg", "kwargs", multiple=True, help="PARAMETER=COLUMN, repeated")
@click.option("--ordering-id", default=None, help="a column overriding the decorator's ordering id")
@click.option("--uniqueness-key", default=None, help="a column overriding the uniqueness key")
@click.option("--rejected", default=None, help="where to write refused rows (JSON lines)")
@MASTER
@click.pass_context
def spark_schedule(ctx: click.Context, path: str, task_name: str, file_format: str, at: str,
                   args: tuple[str, ...], kwargs: tuple[str, ...], ordering_id: str | None,
                   uniqueness_key: str | None, rejected: str | None, master: str | None) -> None:
    """Schedule the task once per row of the file(s) at PATH (CSV with a header line)."""
    from celery_scheduler.api import registered

    app = _app(ctx)
    app.loader.import_default_modules()
    task = registered().get(task_name)
    if task is None:
        raise click.BadParameter(f"{task_name!r} is not a scheduled task of this app; known: "
                                 f"{sorted(registered())}", param_hint="--task")
    with _spark(master) as spark:
        from celery_scheduler.spark import schedule_dataframe

        reader = spark.read.option("header", "true") if file_format == "csv" else spark.read
        df = getattr(reader, file_format)(path)
        result = schedule_dataframe(df, task, at=at, args=list(args) or None,
                                    kwargs=_mapping(kwargs, "--kwarg") or None,
                                    ordering_id=ordering_id, uniqueness_key=uniqueness_key,
                                    app=app)
        if rejected and result.rejected_count:
            result.rejected.write.mode("overwrite").json(rejected)
    click.echo(f"scheduled {result.accepted} row(s), refused {result.rejected_count}"
               + (f" (written to {rejected})" if rejected and result.rejected_count else ""))


@spark_jobs.command(name="report")
@click.argument("output")
@MASTER
@click.pass_context
def spark_report(ctx: click.Context, output: str, master: str | None) -> None:
    """Write the report (Parquet tables and report.html with charts) to the OUTPUT directory."""
    settings = get_client(_app(ctx)).settings
    with _spark(master) as spark:
        from celery_scheduler.spark.report import report

        made = report(spark, settings, output)
    click.echo(f"{made.finished} finished ({made.failed} failed, {made.retried} retried), "
               f"{made.blocked} blocked, {made.overdue} overdue; open {made.html}")


@spark_jobs.command(name="audit")
@MASTER
@click.option("--json", "as_json", is_flag=True, help="print the keys found as JSON lines")
@click.pass_context
def spark_audit(ctx: click.Context, master: str | None, as_json: bool) -> None:
    """List accepted, uncancelled keys the store cannot account for (exit status 1 if any)."""
    settings = get_client(_app(ctx)).settings
    with _spark(master) as spark:
        from celery_scheduler.spark import audit

        found = audit(spark, settings)
        missing = [row.asDict() for row in found.missing.collect()]
    for row in missing:
        click.echo(json.dumps(row) if as_json else
                   f"missing: {row['ordering_id']} at {row['at']} #{row['unique_key']} "
                   f"(partition {row['partition']}, offset {row['offset']}, status {row['state']})")
    click.echo(f"{found.scheduled} key(s) scheduled, {found.cancelled} cancelled, "
               f"{found.missing_count} missing, {found.repeated_count} released more than once",
               err=as_json)
    ctx.exit(1 if found.missing_count else 0)


@spark_jobs.command(name="migrate")
@click.option("--to-topic", required=True, help="the new topic (made by init, with the new count)")
@click.option("--to-keyspace", required=True, help="the new topic's keyspace")
@MASTER
@click.pass_context
def spark_migrate(ctx: click.Context, to_topic: str, to_keyspace: str, master: str | None) -> None:
    """Move every task still in the schedule to another topic (see docs/spark.md first)."""
    source = get_client(_app(ctx)).settings
    target = source.replace(kafka_topic=to_topic, cassandra_keyspace=to_keyspace)
    with _spark(master) as spark:
        from celery_scheduler.spark.migrate import migrate

        try:
            moved = migrate(spark, source, target)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--to-topic") from None
    click.echo(f"moved {moved.moved} task(s) to {to_topic} ({moved.partitions} partitions)")
