from django.utils import timezone
from proj.celery import app

from celery_scheduler import scheduled_task
from reminders.models import Reminder


def reminder_key(reminder_id: int, user: str) -> str:
    return f"reminder-{reminder_id}"


# @app.task rather than @shared_task: a scheduled task publishes with its app's scheduler
# settings (topic, keyspace), and a shared task follows whichever Celery app is current.
@scheduled_task(ordering_id="user", uniqueness_key=reminder_key)
@app.task(name="reminders.send_reminder")
def send_reminder(reminder_id: int, user: str) -> bool:
    """Send the reminder (here: record when it was sent). False if it was already sent."""
    sent = Reminder.objects.filter(pk=reminder_id, sent_at__isnull=True).update(sent_at=timezone.now())
    return sent == 1
