"""``celery scheduler pause``, ``resume`` and ``pauses``: hold back the releases of a task
name, an ordering id or everything, and let them go again (:mod:`celery_scheduler.pauses`)."""

from __future__ import annotations

import json

import click

from celery_scheduler import pauses
from celery_scheduler.cli.group import _app, _fail, scheduler
from celery_scheduler.errors import SchedulerError
from celery_scheduler.keys import from_epoch_ms
from celery_scheduler.store.records import Pause

__all__ = ["describe", "pause_command", "pauses_command", "resume_command"]


def _named(f: click.decorators.FC) -> click.decorators.FC:
    for option in reversed([
            click.option("--task", default=None, metavar="NAME", help="the tasks of this name"),
            click.option("--ordering-id", default=None, metavar="ID", help="the tasks of this ordering id"),
            click.option("--all", "everything", is_flag=True, help="every task")]):
        f = option(f)
    return f


def describe(pause: Pause) -> str:
    at = from_epoch_ms(pause.paused_ms).isoformat(timespec="seconds")
    reason = f": {pause.reason}" if pause.reason else ""
    return f"{pause.label} paused since {at} by {pause.by or 'unknown'}{reason}"


@scheduler.command(name="pause")
@_named
@click.option("--reason", default="", help="why, kept with the pause and shown with it")
@click.pass_context
def pause_command(ctx: click.Context, task: str | None, ordering_id: str | None, everything: bool,
                  reason: str) -> None:
    """Hold back the releases of a task name, an ordering id, or everything (--all).

    Every dispatcher holds them within a few seconds; nothing held is lost, and
    `scheduler resume` releases what fell due meanwhile, in order. Tasks already released
    run on.
    """
    try:
        paused = pauses.pause(_app(ctx), task=task, ordering_id=ordering_id, everything=everything,
                              reason=reason)
    except SchedulerError as exc:
        _fail(exc)
    click.echo(describe(paused))


@scheduler.command(name="resume")
@_named
@click.pass_context
def resume_command(ctx: click.Context, task: str | None, ordering_id: str | None,
                   everything: bool) -> None:
    """Lift the pause of a task name, an ordering id, or of everything (--all)."""
    try:
        lifted = pauses.resume(_app(ctx), task=task, ordering_id=ordering_id, everything=everything)
    except SchedulerError as exc:
        _fail(exc)
    click.echo(f"{lifted.label} resumed")


@scheduler.command(name="pauses")
@click.option("--json", "json_output", is_flag=True, help="print them as JSON")
@click.pass_context
def pauses_command(ctx: click.Context, json_output: bool) -> None:
    """List the pauses in force, oldest first."""
    try:
        kept = pauses.in_force(_app(ctx))
    except SchedulerError as exc:
        _fail(exc)
    if json_output:
        click.echo(json.dumps([pauses.as_json(p) for p in kept], indent=2))
        return
    for pause in kept:
        click.echo(describe(pause))
    if not kept:
        click.echo("nothing is paused")
