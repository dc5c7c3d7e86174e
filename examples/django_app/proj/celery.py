"""The Celery app, wired as in Celery's "First steps with Django"."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")

app = Celery("proj")
# Every Celery setting, the scheduler's included, is read from settings.py with the
# CELERY_ prefix: CELERY_BROKER_URL, CELERY_SCHEDULER_KAFKA_TOPIC, ...
app.config_from_object("django.conf:settings", namespace="CELERY")
# Finds reminders/tasks.py (workers and dispatchers import it to know the scheduled tasks).
app.autodiscover_tasks()
