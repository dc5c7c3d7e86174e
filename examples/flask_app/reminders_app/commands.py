"""``flask --app reminders_app cancel-reminder ID``."""

from __future__ import annotations

import click
from flask import Flask
from flask.cli import with_appcontext

from reminders_app import models
from reminders_app.tasks import send_reminder


@click.command("cancel-reminder")
@click.argument("reminder_id", type=int)
@with_appcontext
def cancel_reminder_command(reminder_id: int) -> None:
    """Cancel a reminder: its scheduled task will not run (unless it was already released)."""
    reminder = models.get(reminder_id)
    if reminder is None:
        raise click.ClickException(f"no reminder {reminder_id}")
    if reminder["sent_at"] is not None:
        raise click.ClickException(f"reminder {reminder_id} was already sent at {reminder['sent_at']}")
    send_reminder.cancel(models.task_key(reminder))  # returns once Kafka has the cancel
    models.mark(reminder_id, "cancelled_at")
    click.echo(f"reminder {reminder_id} cancelled ({models.task_key(reminder)})")


def init_app(app: Flask) -> None:
    app.cli.add_command(cancel_reminder_command)
