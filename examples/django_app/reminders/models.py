from django.db import models

from celery_scheduler import TaskKey


class Reminder(models.Model):
    """A reminder for a user; the scheduler runs ``send_reminder`` for it at ``remind_at``."""

    user = models.CharField(max_length=100)
    text = models.CharField(max_length=500)
    remind_at = models.DateTimeField()  # whole milliseconds: the scheduler's resolution
    sent_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)

    def task_key(self) -> TaskKey:
        """The scheduler's key of this reminder's task: what status and cancel look up.

        Reminders of one user run in order (the ordering id is the user); the uniqueness
        key names the reminder, so scheduling it twice still sends it once.
        """
        return TaskKey(self.user, round(self.remind_at.timestamp() * 1000), f"reminder-{self.pk}")
