"""The ``celery scheduler`` group, its helpers, and the commands that set up, run and act on
the scheduler (``init``, ``dispatch``, ``cancel``, ``retry``); :mod:`~celery_scheduler.cli.jobs`
and :mod:`~celery_scheduler.cli.operate` add the rest to the group."""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Callable
from typing import Any

import click

from celery_scheduler.client import get_client
from celery_scheduler.config import get_settings
from celery_scheduler.errors import SchedulerError
from celery_scheduler.keys import TaskKey, check_key_part, to_epoch_ms

__all__ = ["scheduler"]


def _app(ctx: click.Context) -> Any:
    app = getattr(ctx.obj, "app", None)
    if app is None:
        raise click.UsageError("run it as `celery -A <your app> scheduler ...`")
    return app


def _fail(exc: SchedulerError) -> None:
    click.echo(f"error: {exc}", err=True)
    sys.exit(1)


def _time(text: str, param_hint: str) -> dt.datetime:
    """An ISO 8601 time given on the command line (a trailing Z is UTC)."""
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not an ISO 8601 time", param_hint=param_hint) from None


def _key(ordering_id: str, at: str, uniqueness_key: str) -> TaskKey:
    when = _time(at, "AT")
    try:
        return TaskKey(check_key_part(ordering_id, "ordering id"),
                       to_epoch_ms(when, dt.timezone.utc),
                       check_key_part(uniqueness_key, "uniqueness key"))
    except SchedulerError as exc:
        raise click.BadParameter(str(exc)) from None


@click.group(name="scheduler")
@click.pass_context
def scheduler(ctx: click.Context) -> None:
    """Durable, ordered scheduling of one-off tasks (celery_scheduler)."""


@scheduler.command()
@click.option("--partitions", type=click.IntRange(min=1), default=None,
              help="partitions of a new topic (default: scheduler_kafka_partitions)")
@click.option("--replication-factor", type=click.IntRange(min=1), default=None,
              help="replication factor of a new topic (default: scheduler_kafka_replication_factor)")
@click.pass_context
def init(ctx: click.Context, partitions: int | None, replication_factor: int | None) -> None:
    """Create the Kafka topic and the Cassandra keyspace and tables (idempotent)."""
    from celery_scheduler.environment import create

    try:
        create(get_settings(_app(ctx)), partitions, replication_factor, say=click.echo)
    except SchedulerError as exc:
        _fail(exc)


def _key_command(function: Callable[[click.Context, TaskKey], None]) -> click.Command:
    """A sub-command taking a task key as ORDERING_ID AT UNIQUENESS_KEY."""

    @scheduler.command(name=function.__name__, help=function.__doc__)
    @click.argument("ordering_id")
    @click.argument("at")
    @click.argument("uniqueness_key")
    @click.pass_context
    def command(ctx: click.Context, ordering_id: str, at: str, uniqueness_key: str) -> None:
        function(ctx, _key(ordering_id, at, uniqueness_key))

    return command


@_key_command
def cancel(ctx: click.Context, key: TaskKey) -> None:
    """Cancel the pending task key (AT is ISO 8601, UTC if no offset is given)."""
    from celery_scheduler.operations import request_cancel

    try:
        request_cancel(get_client(_app(ctx)), key)
    except SchedulerError as exc:
        _fail(exc)
    click.echo(f"{key}: cancel requested")


@_key_command
def retry(ctx: click.Context, key: TaskKey) -> None:
    """Run the failed task key once more; a blocked ordering id moves on once it succeeds."""
    from celery_scheduler.operations import request_retry

    try:
        request_retry(get_client(_app(ctx)), key)
    except SchedulerError as exc:
        _fail(exc)
    click.echo(f"{key}: retry requested")


@scheduler.command()
@click.option("--group", default=None, help="consumer group (default: <topic>.dispatchers)")
@click.option("--check", is_flag=True,
              help="only check that Kafka, Cassandra and Redis are usable; exit 0 if so, 1 if not")
@click.option("--loglevel", "-l", default="INFO", show_default=True)
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: one object a line, with task_key, ordering_id, task_id and partition "
                   "on every line about a task")
@click.option("--metrics-port", type=int, default=None,
              help="serve Prometheus metrics on this port (needs the [monitoring] extra)")
@click.pass_context
def dispatch(ctx: click.Context, group: str | None, check: bool, loglevel: str, log_format: str,
             metrics_port: int | None) -> None:
    """Run a dispatcher: persist scheduled tasks and release them to Celery when due."""
    import logging
    import signal

    from celery_scheduler.dispatcher.service import Dispatcher
    from celery_scheduler.dispatcher.service import check as check_dependencies

    app = _app(ctx)
    app.loader.import_default_modules()  # register the app's scheduled tasks
    if check:
        problems = check_dependencies(app)
        for problem in problems:
            click.echo(f"unhealthy: {problem}", err=True)
        if not problems:
            click.echo("ok")
        sys.exit(1 if problems else 0)
    from celery_scheduler.repeats import QuietRepeats

    known: dict[str, int] = {}  # the topic's partition count, once the dispatcher read it
    handler = logging.StreamHandler()
    if log_format == "json":
        from celery_scheduler.logs import JsonFormatter

        handler.setFormatter(JsonFormatter(lambda: known.get("partitions")))
    else:
        handler.setFormatter(logging.Formatter("[%(asctime)s: %(levelname)s/%(name)s] %(message)s"))
    # cassandra-driver's warnings repeated through an outage: once, and a count at its end
    handler.addFilter(QuietRepeats())
    logging.basicConfig(level=loglevel.upper(), handlers=[handler])
    try:
        from celery_scheduler.metrics import Metrics, serve

        metrics = serve(metrics_port) if metrics_port is not None else Metrics()
        dispatcher = Dispatcher(app, group_id=group, metrics=metrics)
        known["partitions"] = dispatcher.partition_count
    except SchedulerError as exc:
        _fail(exc)

    def stop(signum: int, frame: object) -> None:
        logging.getLogger(__name__).info("received signal %d; stopping", signum)
        dispatcher.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        dispatcher.run()
    except SchedulerError as exc:
        _fail(exc)
