"""``celery scheduler reschedule``: move a pending task key to another time
(:mod:`celery_scheduler.reschedules`)."""

from __future__ import annotations

import datetime as dt

import click

from celery_scheduler.cli.group import _app, _fail, _key, _time, scheduler
from celery_scheduler.client import get_client
from celery_scheduler.errors import SchedulerError

__all__ = ["reschedule_command"]


@scheduler.command(name="reschedule")
@click.argument("ordering_id")
@click.argument("at")
@click.argument("uniqueness_key")
@click.option("--to", "to", default=None, metavar="TIME",
              help="the new time, ISO 8601 (UTC if no offset is given)")
@click.option("--in", "delay", type=float, default=None, metavar="SECONDS",
              help="the new time, this many seconds from now")
@click.pass_context
def reschedule_command(ctx: click.Context, ordering_id: str, at: str, uniqueness_key: str,
                       to: str | None, delay: float | None) -> None:
    """Move the pending task key to another time (--to TIME or --in SECONDS).

    The task keeps its ordering id, uniqueness key, arguments and task id, and runs at the
    new time in its ordering id's order; its old time never fires. A key released already
    (or finished, cancelled, moved) is refused with the reason. Noted in the operators' log.
    """
    from celery_scheduler.reschedules import new_time_ms, request_reschedule

    key = _key(ordering_id, at, uniqueness_key)
    client = get_client(_app(ctx))
    try:
        when = _time(to, "--to") if to is not None else None
        moved = request_reschedule(client, key, new_time_ms(when, delay, client.clock(), dt.timezone.utc))
    except SchedulerError as exc:
        _fail(exc)
    click.echo(f"{key}: reschedule requested; its new key is {moved.key}")
