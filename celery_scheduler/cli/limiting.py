"""``celery scheduler rate-limit`` and ``rate-limits``: cap the releases of a task name
(across every dispatcher) or of an ordering id (:mod:`celery_scheduler.rate_limits`)."""

from __future__ import annotations

import json

import click

from celery_scheduler import rate_limits
from celery_scheduler.cli.group import _app, _fail, scheduler
from celery_scheduler.errors import RateLimitError, SchedulerError
from celery_scheduler.keys import from_epoch_ms
from celery_scheduler.store.records import RateLimit

__all__ = ["describe", "rate_limit_command", "rate_limits_command"]


def describe(limit: RateLimit) -> str:
    at = from_epoch_ms(limit.set_ms).isoformat(timespec="seconds")
    return f"{limit.label} at most {limit.per_second:g}/s, since {at} by {limit.by or 'unknown'}"


@scheduler.command(name="rate-limit")
@click.option("--task", default=None, metavar="NAME", help="the releases of this task name")
@click.option("--ordering-id", default=None, metavar="ID", help="the releases of this ordering id")
@click.option("--per-second", type=float, default=None, help="at most this many releases a second")
@click.option("--lift", is_flag=True, help="lift the limit instead")
@click.pass_context
def rate_limit_command(ctx: click.Context, task: str | None, ordering_id: str | None,
                       per_second: float | None, lift: bool) -> None:
    """Cap the releases of a task name (across every dispatcher) or of an ordering id at
    --per-second, or --lift the cap.

    Every dispatcher applies it within a few seconds; a task name's limit is shared among
    them by the partitions each holds. Nothing is dropped: what waits goes at the limit's
    pace, in order.
    """
    if lift == (per_second is not None):
        raise click.UsageError("give --per-second N, or --lift")
    try:
        if lift:
            lifted = rate_limits.lift(_app(ctx), task=task, ordering_id=ordering_id)
            click.echo(f"{lifted.label}: rate limit lifted")
            return
        assert per_second is not None
        click.echo(describe(rate_limits.limit(_app(ctx), task=task, ordering_id=ordering_id,
                                              per_second=per_second)))
    except RateLimitError as exc:
        raise click.UsageError(str(exc)) from None
    except SchedulerError as exc:
        _fail(exc)


@scheduler.command(name="rate-limits")
@click.option("--json", "json_output", is_flag=True, help="print them as JSON")
@click.pass_context
def rate_limits_command(ctx: click.Context, json_output: bool) -> None:
    """List the rate limits in force, oldest first."""
    try:
        kept = rate_limits.in_force(_app(ctx))
    except SchedulerError as exc:
        _fail(exc)
    if json_output:
        click.echo(json.dumps([rate_limits.as_json(r) for r in kept], indent=2))
        return
    for limit in kept:
        click.echo(describe(limit))
    if not kept:
        click.echo("no rate limit is in force")
