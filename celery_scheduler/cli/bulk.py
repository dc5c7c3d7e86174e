"""``celery scheduler cancel-many``: cancel every pending key of an ordering id, a task name or
a span of due times (:mod:`celery_scheduler.bulk_cancel`), after a count and a confirmation."""

from __future__ import annotations

import datetime as dt
import json

import click

from celery_scheduler.bulk_cancel import BulkCancel, Selection, cancel_many, settle
from celery_scheduler.cli.group import _app, _fail, _time, scheduler
from celery_scheduler.client import get_client
from celery_scheduler.errors import SchedulerError

__all__ = ["cancel_many_command"]


def _when(text: str | None, option: str) -> dt.datetime | None:
    if text is None:
        return None
    when = _time(text, option)
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.timezone.utc)


def _progress(report: BulkCancel) -> None:
    verb = "found pending" if report.dry_run else "cancel requested for"
    click.echo(f"... {verb} {report.requested}, released {report.released}, cancelled before "
               f"{report.already_cancelled}", err=True)


@scheduler.command(name="cancel-many")
@click.option("--ordering-id", default=None, help="the keys of this ordering id")
@click.option("--task", default=None, help="the keys of this task name")
@click.option("--from", "due_from", default=None, metavar="TIME",
              help="due at or after this ISO 8601 time (UTC if no offset is given)")
@click.option("--before", "due_before", default=None, metavar="TIME",
              help="due before this ISO 8601 time (UTC if no offset is given)")
@click.option("--dry-run", is_flag=True, help="count and list the keys, cancel nothing")
@click.option("--yes", is_flag=True, help="do not ask for confirmation")
@click.option("--wait", "wait_seconds", type=click.FloatRange(min=0), default=0.0,
              show_default=True,
              help="then wait up to this long for the dispatchers to apply the cancels, and say "
                   "how many ended cancelled")
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
@click.pass_context
def cancel_many_command(ctx: click.Context, ordering_id: str | None, task: str | None,
                        due_from: str | None, due_before: str | None, dry_run: bool, yes: bool,
                        wait_seconds: float, as_json: bool) -> None:
    """Cancel every pending key that meets all the criteria given (at least one).

    Keys already released to the workers are left to run and counted apart. Without --yes
    (or with --dry-run) the keys are counted first; progress goes to stderr a page at a time.
    Running the same command again is safe: what is cancelled is found cancelled.
    """
    client = get_client(_app(ctx))
    try:
        selection = Selection(ordering_id, task, _when(due_from, "--from"), _when(due_before, "--before"))
        if dry_run or not yes:
            counted = cancel_many(client, selection, dry_run=True, progress=_progress)
            if dry_run:
                _show(counted, as_json)
                return
            click.echo(counted.summary())
            if counted.requested == 0:
                return
            click.confirm(f"cancel these {counted.requested} pending key(s)?", abort=True)
        report = cancel_many(client, selection, keep_keys=wait_seconds > 0, progress=_progress)
        if wait_seconds > 0:
            settle(client, report, wait_seconds)
    except SchedulerError as exc:
        _fail(exc)
    _show(report, as_json)


def _show(report: BulkCancel, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(report.as_json(), indent=2))
        return
    click.echo(report.summary())
    for kind, keys in report.examples.items():
        if keys:
            shown = "\n  ".join(str(key) for key in keys)
            more = report.requested if kind == "requested" else report.released
            click.echo(f"{kind} ({len(keys)} of {more} shown):\n  {shown}")
