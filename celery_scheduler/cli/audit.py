"""``celery scheduler audit``: the operators' log, newest first (:mod:`celery_scheduler.audit`)."""

from __future__ import annotations

import json

import click

from celery_scheduler import audit
from celery_scheduler.cli.group import _app, _fail, scheduler
from celery_scheduler.errors import SchedulerError
from celery_scheduler.keys import from_epoch_ms

__all__ = ["audit_command"]


@scheduler.command(name="audit")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True,
              help="how many of the last actions")
@click.option("--json", "json_output", is_flag=True, help="print them as JSON")
@click.pass_context
def audit_command(ctx: click.Context, limit: int, json_output: bool) -> None:
    """Who paused, resumed, cancelled, retried or changed what, and when (newest first)."""
    try:
        actions = audit.recent(_app(ctx), limit)
    except SchedulerError as exc:
        _fail(exc)
    for action in ([] if json_output else actions):
        at = from_epoch_ms(action.at_ms).isoformat(timespec="seconds")
        detail = f": {action.detail}" if action.detail else ""
        click.echo(f"{at} {action.actor} {action.action} {action.target}{detail}")
    if json_output:
        click.echo(json.dumps([audit.as_json(action) for action in actions], indent=2))
    elif not actions:
        click.echo("no operator action is on record")
