from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from reminders.models import Reminder
from reminders.tasks import send_reminder


class Command(BaseCommand):
    help = "Cancel a reminder: its scheduled task will not run (unless it was already released)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("reminder_id", type=int)

    def handle(self, *args: Any, reminder_id: int, **options: Any) -> None:
        try:
            reminder = Reminder.objects.get(pk=reminder_id)
        except Reminder.DoesNotExist:
            raise CommandError(f"no reminder {reminder_id}") from None
        if reminder.sent_at is not None:
            raise CommandError(f"reminder {reminder_id} was already sent at {reminder.sent_at}")
        send_reminder.cancel(reminder.task_key())  # returns once Kafka has the cancel
        Reminder.objects.filter(pk=reminder.pk).update(cancelled_at=timezone.now())
        self.stdout.write(f"reminder {reminder_id} cancelled ({reminder.task_key()})")
