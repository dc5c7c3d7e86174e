"""Releases: how a due task leaves the dispatcher for ordinary Celery workers.

- :mod:`~celery_scheduler.release.message` builds a release as a Celery message (the task,
  its arguments and options, a task id derived from the key, the ``celery_scheduler``
  header the worker hooks read);
- :mod:`~celery_scheduler.release.publisher` publishes releases through one producer and
  says of each whether it was sent, is uncertain, or was not;
- :mod:`~celery_scheduler.release.redis_push` pushes a release's document to Redis itself, in
  one pipeline, and :mod:`~celery_scheduler.release.template` builds those documents from a
  template per task and route;
- :mod:`~celery_scheduler.release.confirms` collects RabbitMQ's publisher confirms.

A delayed Kafka message (``schedule_message``) is released to Kafka instead
(:mod:`celery_scheduler.tasklog.delivery`).
"""

from celery_scheduler.release.message import (
    CELERY_RETRIES_EXHAUSTED,
    publish,
    send_release,
    task_message,
)
from celery_scheduler.release.publisher import Prepared, Publisher, publish_each

__all__ = ["CELERY_RETRIES_EXHAUSTED", "Prepared", "Publisher", "publish", "publish_each",
           "send_release", "task_message"]
