from __future__ import annotations

from celery import shared_task

from celery_scheduler import scheduled_task
from reminders_app import models


def reminder_key(reminder_id: int, user: str) -> str:
    return f"reminder-{reminder_id}"


# @shared_task, as in Flask's docs: there is no Celery app until create_app() makes one.
@scheduled_task(ordering_id="user", uniqueness_key=reminder_key)
@shared_task(name="reminders_app.send_reminder")
def send_reminder(reminder_id: int, user: str) -> bool:
    """Send the reminder (here: record when it was sent). False if it was already sent."""
    return models.mark(reminder_id, "sent_at")
