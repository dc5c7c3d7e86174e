"""``celery scheduler periodic``: the app's periodic entries (``beat_schedule``) as the
dispatchers fire them, and the operator's ways to run one now or backfill a span.

::

    celery -A proj scheduler periodic list [--next N] [--json]
    celery -A proj scheduler periodic trigger NAME         # one run now, after the entry's others
    celery -A proj scheduler periodic backfill NAME SINCE UNTIL [--yes]
    celery -A proj scheduler periodic pause|resume|delete|reset NAME
    celery -A proj scheduler periodic add NAME --task TASK (--every SECONDS | --crontab "M H DOM MON DOW"
                                                            | --solar "EVENT LAT LON")
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Callable

import click

from celery_scheduler.cli.group import _app, _fail, scheduler
from celery_scheduler.client import SchedulerClient, get_client
from celery_scheduler.clock import now_ms
from celery_scheduler.errors import PeriodicEntryError, SchedulerError
from celery_scheduler.keys import MAX_MS, TaskKey, from_epoch_ms, to_epoch_ms
from celery_scheduler.partitioner import partition_for
from celery_scheduler.periodic import Entry, Overlap, envelope_of, occurrences, ordering_id_of
from celery_scheduler.periodic import key as key_of
from celery_scheduler.periodic_entries import app_entries
from celery_scheduler.periodic_views import entry_views

__all__ = ["periodic"]

# The most occurrences one backfill schedules without --yes.
BACKFILL_WITHOUT_ASKING = 100


def _iso(when: dt.datetime | int | None) -> str | None:
    if when is None:
        return None
    return (from_epoch_ms(when) if isinstance(when, int) else when).isoformat(timespec="seconds")


def _time(text: str, what: str) -> int:
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not an ISO 8601 time", param_hint=what) from None
    if when.tzinfo is None:
        raise click.BadParameter(f"{text!r} has no UTC offset; add one (Z for UTC)", param_hint=what)
    return to_epoch_ms(when, dt.timezone.utc)


def _partitioner(client: SchedulerClient) -> Callable[[str], int]:
    """The topic's partitioner, for the keys of an allow_all entry (the partition count is
    read when first needed)."""
    return lambda ordering_id: partition_for(ordering_id, client.task_log.partitions())


def _entry(app: object, name: str) -> Entry:
    try:
        found = {entry.name: entry for entry in app_entries(app)}
    except PeriodicEntryError as exc:
        _fail(exc)
    if name not in found:
        raise click.BadParameter(f"no periodic entry {name!r} in the app's beat_schedule; it has: "
                                 f"{', '.join(sorted(found)) or 'none'}", param_hint="NAME")
    return found[name]


@scheduler.group(name="periodic")
def periodic() -> None:
    """The app's periodic entries (beat_schedule), fired by the dispatchers (scheduler_periodic)."""


@periodic.command(name="list")
@click.option("--next", "upcoming", type=click.IntRange(min=0, max=100), default=3,
              show_default=True, help="how many next occurrences to show")
@click.option("--json", "as_json", is_flag=True, help="print JSON lines")
@click.pass_context
def list_entries(ctx: click.Context, upcoming: int, as_json: bool) -> None:
    """Each entry: its task, schedule, partition, the occurrence it fired last (and how that run
    stands) and the next ones."""
    app = _app(ctx)
    try:
        views = entry_views(app, get_client(app), upcoming)
    except SchedulerError as exc:
        _fail(exc)
    for view in views:
        if as_json:
            click.echo(json.dumps({**dataclasses.asdict(view),
                                   "last_fired": _iso(view.last_fired),
                                   "next": [_iso(at) for at in view.next]}))
            continue
        click.echo(f"{view.name}: {view.task} {view.schedule}, partition {view.partition}, "
                   f"catch up {view.catch_up}, last fired {_iso(view.last_fired) or '-'}"
                   + (f" ({view.last_state})" if view.last_state else "")
                   + (f", next {', '.join(_iso(at) or '' for at in view.next)}" if view.next else "")
                   + ("" if view.scheduled_task else
                      " (not a scheduled task here: see celery_scheduler.periodic_tasks.install)"))
    if not views:
        click.echo("the app's beat_schedule has no entries")


@periodic.command()
@click.argument("name")
@click.pass_context
def trigger(ctx: click.Context, name: str) -> None:
    """Run entry NAME once now, besides its occurrences (after the ones due before it)."""
    app = _app(ctx)
    entry = _entry(app, name)
    client = get_client(app)
    now = now_ms()
    try:
        key = TaskKey(ordering_id_of(entry, now, _partitioner(client)), now, f"trigger-{_iso(now)}")
        client.publish(envelope_of(entry, key, client.settings.retry_policy, now))
    except SchedulerError as exc:
        _fail(exc)
    click.echo(f"scheduled {key} now")


@periodic.command()
@click.argument("name")
@click.argument("since")
@click.argument("until")
@click.option("--yes", is_flag=True, help="do not ask for confirmation")
@click.pass_context
def backfill(ctx: click.Context, name: str, since: str, until: str, yes: bool) -> None:
    """Schedule entry NAME's occurrences from SINCE to UNTIL (ISO 8601 times with an offset).

    Each gets the key the dispatchers give that occurrence, so an occurrence that already
    ran, or was backfilled before, does not run again.
    """
    app = _app(ctx)
    entry = _entry(app, name)
    start, end = _time(since, "SINCE"), _time(until, "UNTIL")
    if end < start:
        raise click.BadParameter(f"UNTIL {until} is before SINCE {since}", param_hint="UNTIL")
    try:
        found = occurrences(entry, start - 1, min(end, MAX_MS), app.timezone)
    except PeriodicEntryError as exc:
        _fail(exc)
    if not found:
        click.echo(f"{name} has no occurrence from {since} to {until}")
        return
    if len(found) > BACKFILL_WITHOUT_ASKING and not yes:
        click.confirm(f"schedule {len(found)} occurrences of {name}?", abort=True)
    client = get_client(app)
    retry = client.settings.retry_policy
    try:  # not acknowledged: the same backfill made again runs each occurrence once
        keys = [key_of(entry, at, _partitioner(client)) for at in found]
        client.publish_many([(k.ordering_id, client.encode(envelope_of(entry, k, retry, now_ms())))
                             for k in keys]).wait(client.settings.kafka_produce_timeout * 2)
    except SchedulerError as exc:
        _fail(exc)
    click.echo(f"scheduled {len(found)} occurrence(s) of {name}, {_iso(found[0])} to {_iso(found[-1])}")


def _admin(ctx: click.Context, action: str, name: str) -> None:
    from celery_scheduler import periodic_admin

    app = _app(ctx)
    try:
        getattr(periodic_admin, action)(app, name)
    except SchedulerError as exc:
        _fail(exc)
    done = {"pause": "paused", "resume": "resumed", "delete": "deleted"}.get(action)
    click.echo(f"{name}: {done}; the dispatcher that fires it applies that within seconds"
               if done else f"{name}: as beat_schedule says again")


def _admin_command(action: str, doc: str) -> None:
    @periodic.command(name=action, help=doc)
    @click.argument("name")
    @click.pass_context
    def command(ctx: click.Context, name: str) -> None:
        _admin(ctx, action, name)


for _action, _doc in (
        ("pause", "Entry NAME fires nothing until resumed (what falls due meanwhile is skipped)."),
        ("resume", "Entry NAME fires again, from its first occurrence after now."),
        ("delete", "Entry NAME never fires again, whatever beat_schedule says (until reset)."),
        ("reset", "Forget what was changed of entry NAME at run time.")):
    _admin_command(_action, _doc)


@periodic.command()
@click.argument("name")
@click.option("--task", required=True, help="a scheduled task's name")
@click.option("--every", type=click.FloatRange(min=0.001), default=None, help="seconds between runs")
@click.option("--crontab", "cron", default=None, help='"MINUTE HOUR DAY_OF_MONTH MONTH DAY_OF_WEEK"')
@click.option("--solar", default=None, help='"EVENT LATITUDE LONGITUDE", e.g. "sunrise 48.85 2.35"')
@click.option("--args", "args_json", default="[]", show_default=True, help="JSON list")
@click.option("--kwargs", "kwargs_json", default="{}", show_default=True, help="JSON object")
@click.option("--options", "options_json", default="{}", show_default=True, help="Celery options, JSON")
@click.option("--catch-up", type=click.Choice(["last", "all", "none"]), default="last", show_default=True)
@click.option("--jitter", type=click.FloatRange(min=0), default=0.0, show_default=True, help="seconds")
@click.option("--overlap", type=click.Choice([o.value for o in Overlap]), default="buffer_all",
              show_default=True, help="what an occurrence does while the run before has not finished")
@click.pass_context
def add(ctx: click.Context, name: str, task: str, every: float | None, cron: str | None,
        solar: str | None, args_json: str, kwargs_json: str, options_json: str, catch_up: str,
        jitter: float, overlap: str) -> None:
    """Add entry NAME at run time, or replace its definition."""
    from celery_scheduler import periodic_admin

    try:
        schedule = periodic_admin.schedule_from_text(name, every, cron, solar)
    except PeriodicEntryError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        spec = {"task": task, "schedule": schedule, "args": json.loads(args_json),
                "kwargs": json.loads(kwargs_json), "options": json.loads(options_json),
                "catch_up": catch_up, "jitter": jitter, "overlap": overlap}
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}") from None
    app = _app(ctx)
    try:
        periodic_admin.add(app, name, spec)
    except SchedulerError as exc:
        _fail(exc)
    click.echo(f"{name}: added; the dispatcher that fires it applies that within seconds")
