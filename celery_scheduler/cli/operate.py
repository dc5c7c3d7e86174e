"""The operator's commands: the state of every partition, one key, dead letters, the console."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, TypeVar

import click

from celery_scheduler.cli.group import _app, _fail, _key, scheduler
from celery_scheduler.client import get_client
from celery_scheduler.clock import now_ms
from celery_scheduler.config import get_settings
from celery_scheduler.errors import SchedulerError, TaskLogUnavailableError
from celery_scheduler.keys import TaskKey
from celery_scheduler.operations import LISTED_STATES

T = TypeVar("T")


@scheduler.command()
@click.argument("key", nargs=-1, metavar="[ORDERING_ID AT UNIQUENESS_KEY]")
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of a table")
@click.option("--no-lag", is_flag=True, help="do not ask Kafka for the dispatchers' lag")
@click.pass_context
def status(ctx: click.Context, key: tuple[str, ...], as_json: bool, no_lag: bool) -> None:
    """Show every partition (owner, lease, backlog, lag), or the status of one task key.

    AT is ISO 8601, UTC if no offset is given.
    """
    if key and len(key) != 3:
        raise click.UsageError("give a whole task key: ORDERING_ID AT UNIQUENESS_KEY, or nothing")
    client = get_client(_app(ctx))
    if key:
        _key_status(client, _key(*key), as_json)
        return
    from celery_scheduler.operations import consumer_lag, partitions

    try:
        lags = None if no_lag else consumer_lag(client.settings)
        views = partitions(client.task_log.partitions(), client.store, now_ms(), lags)
        paused = client.store.pauses()
        limits = client.store.rate_limits()
    except SchedulerError as exc:
        _fail(exc)
    if as_json:
        click.echo(json.dumps([asdict(view) for view in views], indent=2))
        return
    rows: list[tuple[str, ...]] = [("partition", "owner", "epoch", "lease", "pending", "oldest",
                                    "overdue", "lag")]
    for v in views:
        lease = "-" if v.owner is None else ("held" if v.leased else "expired")
        rows.append((str(v.partition), v.owner or "-", str(v.epoch), lease, str(v.pending),
                     v.oldest or "-", f"{v.overdue_seconds:.0f}s" if v.overdue_seconds else "-",
                     "?" if v.lag is None else str(v.lag)))
    _table([row[:-1] for row in rows] if no_lag else rows)  # --no-lag: no lag column
    click.echo(f"{sum(v.pending for v in views)} task(s) in the schedule, "
               f"{sum(1 for v in views if v.leased)} of {len(views)} partitions leased"
               + ("" if no_lag else f", {sum(v.lag or 0 for v in views)} record(s) not yet read"))
    if paused:
        click.echo(f"paused ({len(paused)}; see `scheduler pauses`): "
                   + ", ".join(sorted(p.label for p in paused)[:10]) + (", ..." if len(paused) > 10 else ""))
    if limits:
        click.echo(f"rate-limited ({len(limits)}; see `scheduler rate-limits`): "
                   + ", ".join(sorted(f"{r.label} {r.per_second:g}/s" for r in limits)[:10])
                   + (", ..." if len(limits) > 10 else ""))


def _table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def _known(key: TaskKey, read: Callable[[TaskKey], T | None]) -> T:
    """What *read* says of *key*; exit 3 when the store does not know it, 1 when it failed."""
    try:
        found = read(key)
    except SchedulerError as exc:
        _fail(exc)
    if found is None:
        click.echo(f"{key}: unknown (never stored, or its status expired)")
        sys.exit(3)
    return found


def _key_status(client: Any, key: TaskKey, as_json: bool) -> None:
    found = _known(key, client.store.status)
    if as_json:
        click.echo(json.dumps({"key": str(key), "state": found.state.value, "task": found.task,
                               "partition": found.partition, "attempts": found.attempts,
                               "last_error": found.last_error}))
        return
    click.echo(f"{key}: {found.state.value}, task {found.task}, partition {found.partition}, "
               f"attempts {found.attempts}"
               + (f", last error: {found.last_error}" if found.last_error else ""))


@scheduler.command()
@click.argument("ordering_id")
@click.argument("at")
@click.argument("uniqueness_key")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@click.pass_context
def inspect(ctx: click.Context, ordering_id: str, at: str, uniqueness_key: str,
            as_json: bool) -> None:
    """Show everything stored of a task key: its task, arguments, status and attempts, where
    a reschedule moved it, and what operators did to it (the operators' log)."""
    from celery_scheduler.operations import describe_key

    client = get_client(_app(ctx))
    described = _known(_key(ordering_id, at, uniqueness_key),
                       lambda key: describe_key(client.store, key, client.clock()))
    if as_json:
        click.echo(json.dumps(described, indent=2, ensure_ascii=False))
        return
    for name, value in described.items():
        if isinstance(value, list):
            click.echo(f"{name + ':':<16}" + f"\n{'':<16}".join(map(str, value)))
        elif value is not None:
            click.echo(f"{name + ':':<16}{value}")


@scheduler.command(name="list")
@click.option("--ordering-id", default=None, help="list this ordering id's tasks, in run order")
@click.option("--state", type=click.Choice(LISTED_STATES), default=None,
              help="or list the tasks that failed, are blocked, or are released (running)")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@click.pass_context
def list_tasks(ctx: click.Context, ordering_id: str | None, state: str | None, limit: int,
               as_json: bool) -> None:
    """List an ordering id's tasks still in the schedule, or the tasks in a state.

    --state failed scans the status table, and blocked or released walk the whole schedule:
    an operator's query, costly on a large deployment.
    """
    from celery_scheduler.operations import ordering_id_tasks, tasks_in_state, waiting_note

    if (ordering_id is None) == (state is None):
        raise click.UsageError("give one of --ordering-id and --state")
    client = get_client(_app(ctx))
    try:
        if ordering_id is not None:
            tasks = ordering_id_tasks(client.store, client.task_log.partitions(), ordering_id, limit)
            for task in tasks:
                task["note"] = waiting_note(task)
        else:
            assert state is not None
            tasks = tasks_in_state(client.store, client.task_log.partitions(), state, limit)
    except SchedulerError as exc:
        _fail(exc)
    if as_json:
        click.echo(json.dumps(tasks, indent=2, ensure_ascii=False))
        return
    rows: list[tuple[str, ...]] = [
        ("at", "uniqueness key", "task", "state", "attempts", "note") if ordering_id else
        ("ordering id", "at", "uniqueness key", "task", "attempts", "note", "last error")]
    for task in tasks:
        rows.append((task["at"], task["unique"], task["task"], task["state"],
                     str(task["attempts"]), task["note"]) if ordering_id else
                    (task["ordering_id"], task["at"], task["unique"], task["task"],
                     str(task["attempts"]), task["note"], task["last_error"] or ""))
    _table(rows)
    click.echo(f"{len(tasks)} task(s) of {ordering_id!r} in the schedule" if ordering_id
               else f"{len(tasks)} {state} task(s)" + (" (the limit)" if len(tasks) == limit else ""))


@scheduler.group(name="dead-letters")
def dead_letters() -> None:
    """Records the dispatchers refused (bad input, unknown task, wrong partition), with why."""


@dead_letters.command(name="list")
@click.option("--reason", default=None, help="only those whose reason contains this text")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print JSON lines")
@click.pass_context
def list_dead_letters(ctx: click.Context, reason: str | None, limit: int, as_json: bool) -> None:
    """List the dead letters, oldest first."""
    from celery_scheduler.operations import read_dead_letters

    settings = get_settings(_app(ctx))
    shown = 0
    try:
        for letter in read_dead_letters(settings, reason):
            if shown == limit:
                click.echo("(more; raise --limit)", err=True)
                break
            shown += 1
            if as_json:
                click.echo(json.dumps(letter.as_json(), ensure_ascii=False))
            else:
                click.echo(f"#{letter.offset} {letter.source} task={letter.task or '?'} "
                           f"key={letter.as_json()['key']}: {letter.reason}")
    except SchedulerError as exc:
        _fail(exc)
    if not as_json:
        click.echo(f"{shown} dead letter(s)" + (f" whose reason contains {reason!r}" if reason else ""))


@dead_letters.command(name="replay")
@click.option("--reason", default=None, help="only those whose reason contains this text")
@click.option("--yes", is_flag=True, help="do not ask for confirmation")
@click.pass_context
def replay_dead_letters(ctx: click.Context, reason: str | None, yes: bool) -> None:
    """Schedule the dead letters again (after a fix: a task registered, a producer corrected).

    Each goes back to the scheduler topic as a new schedule call of the same task key, so a
    key that already ran or was cancelled is not run again, and replaying twice runs it once.
    """
    from celery_scheduler.operations import read_dead_letters, replay

    app = _app(ctx)
    client = get_client(app)
    try:
        letters = list(read_dead_letters(client.settings, reason))
        if not letters:
            click.echo("no dead letters to replay")
            return
        if not yes:
            click.confirm(f"replay {len(letters)} dead letter(s)?", abort=True)
        with click.progressbar(letters, label="replaying") as shown:
            replayed, skipped = replay(lambda key, data: client.publish_record(key, data, wait=False),
                                       iter(shown))
        if client.flush(client.settings.kafka_produce_timeout * 2):
            raise TaskLogUnavailableError("Kafka did not acknowledge every replayed record")
    except SchedulerError as exc:
        _fail(exc)
    click.echo(f"replayed {replayed}, skipped {skipped} (no key or no value)")



@scheduler.command()
@click.option("--wait", "wait_seconds", type=click.FloatRange(min=0), default=0.0,
              help="ask again every half second for up to this many seconds (default: once)")
@click.pass_context
def ready(ctx: click.Context, wait_seconds: float) -> None:
    """Exit 0 once every partition of the topic is leased by a running dispatcher, else 1.

    For scripts and CI that start dispatchers and must wait until they release tasks (a
    schedule call made before is kept, and released once a dispatcher has its partition).
    Exit 1 names the partitions nobody leased yet.
    """
    import time

    from celery_scheduler.operations import partitions

    client = get_client(_app(ctx))
    started = time.monotonic()
    while True:
        try:
            views = partitions(client.task_log.partitions(), client.store, now_ms())
        except SchedulerError as exc:
            if time.monotonic() - started >= wait_seconds:
                _fail(exc)
            time.sleep(0.5)
            continue
        missing = [v.partition for v in views if not v.leased]
        waited = time.monotonic() - started
        if not missing:
            owners = len({v.owner for v in views})
            click.echo(f"ready: {len(views)} of {len(views)} partitions leased by {owners} "
                       f"dispatcher(s) (after {waited:.1f}s)")
            return
        if waited >= wait_seconds:
            shown = ", ".join(map(str, missing[:20])) + (", ..." if len(missing) > 20 else "")
            click.echo(f"not ready: {len(views) - len(missing)} of {len(views)} partitions "
                       f"leased after {waited:.1f}s; not leased: {shown}", err=True)
            sys.exit(1)
        time.sleep(0.5)


@scheduler.command()
@click.option("--group", default=None,
              help="the dispatchers' consumer group, if dispatch ran with --group")
@click.option("--yes", is_flag=True, help="do not ask for confirmation")
@click.pass_context
def drop(ctx: click.Context, group: str | None, yes: bool) -> None:
    """Delete this app's scheduler environment: topics, consumer groups and keyspace.

    For test and CI environments. Every pending task, status and dead letter in them is gone
    for good. Stop the dispatchers first (a group with members is not deleted). What does not
    exist is skipped, so it can follow a set-up that failed half-way.
    """
    from celery_scheduler.environment import drop as drop_environment
    from celery_scheduler.environment import environment

    settings = get_settings(_app(ctx))
    names = environment(settings, group)
    listed = [*(f"kafka topic {t}" for t in names.topics),
              *(f"consumer group {g}" for g in names.groups), f"cassandra keyspace {names.keyspace}"]
    if not yes:
        click.echo("this deletes, with everything in them:\n  " + "\n  ".join(listed))
        click.confirm("drop them?", abort=True)
    try:
        dropped = drop_environment(settings, group)
    except SchedulerError as exc:
        _fail(exc)
    for name in dropped.removed:
        click.echo(f"dropped {name}")
    for name in dropped.absent:
        click.echo(f"{name}: not there")


@scheduler.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.pass_context
def serve(ctx: click.Context, host: str, port: int) -> None:
    """Serve the web console (/) and the HTTP API (/api/v1, OpenAPI at /openapi.json).

    Needs the web extra and tokens in scheduler_api_tokens.
    """
    app = _app(ctx)
    app.loader.import_default_modules()  # the tasks the API may schedule
    try:
        import uvicorn

        from celery_scheduler.web import create_app
    except ImportError as exc:
        raise click.ClickException(f"{exc}; pip install 'celery-scheduler[web]'") from None
    settings = get_settings(app)
    if not settings.api_tokens:
        click.echo("warning: scheduler_api_tokens is empty, so every request is refused", err=True)
    uvicorn.run(create_app(app), host=host, port=port, log_level="info")


