"""Settings of the reminders example: one app, SQLite, Celery and the scheduler.

Each value can be overridden by an environment variable of the same name, so the same
project runs on a laptop and in the tests (which give it a topic and keyspace of their own).
"""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]

INSTALLED_APPS = ["reminders"]
MIDDLEWARE = ["django.middleware.common.CommonMiddleware"]
ROOT_URLCONF = "proj.urls"

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("REMINDERS_DATABASE", str(BASE_DIR / "db.sqlite3")),
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


# Celery (read by proj/celery.py with namespace="CELERY")
CELERY_BROKER_URL = _env("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0")
CELERY_TASK_DEFAULT_QUEUE = _env("CELERY_TASK_DEFAULT_QUEUE", "django_reminders")
CELERY_TASK_IGNORE_RESULT = True  # the scheduler records outcomes itself
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# The scheduler: Celery's scheduler_* settings, with the CELERY_ prefix
CELERY_SCHEDULER_KAFKA_BOOTSTRAP_SERVERS = _env("CELERY_SCHEDULER_KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
CELERY_SCHEDULER_KAFKA_TOPIC = _env("CELERY_SCHEDULER_KAFKA_TOPIC", "django_reminders")
CELERY_SCHEDULER_KAFKA_PARTITIONS = int(_env("CELERY_SCHEDULER_KAFKA_PARTITIONS", "6"))
CELERY_SCHEDULER_CASSANDRA_CONTACT_POINTS = _env("CELERY_SCHEDULER_CASSANDRA_CONTACT_POINTS", "127.0.0.1")
CELERY_SCHEDULER_CASSANDRA_KEYSPACE = _env("CELERY_SCHEDULER_CASSANDRA_KEYSPACE", "django_reminders")
