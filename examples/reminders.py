"""Example app: reminders for customers, run in order per customer.

Run it with the demo (``scripts/demo``) or by hand::

    celery -A examples.reminders scheduler init
    celery -A examples.reminders scheduler dispatch
    celery -A examples.reminders worker --loglevel=INFO
    python -m examples.reminders            # schedules a few reminders
"""

from __future__ import annotations

import datetime as dt
import os

from celery import Celery

from celery_scheduler import scheduled_task

app = Celery(
    "reminders",
    broker=os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0"),
    backend=os.environ.get("CELERY_RESULT_BACKEND", "redis://127.0.0.1:6379/0"),
)
app.conf.update(
    scheduler_kafka_bootstrap_servers=os.environ.get("KAFKA_BOOTSTRAP", "127.0.0.1:9092"),
    scheduler_kafka_topic="reminders_schedule",
    scheduler_kafka_partitions=6,
    scheduler_cassandra_contact_points=os.environ.get("CASSANDRA_HOSTS", "127.0.0.1"),
    scheduler_cassandra_keyspace="reminders",
    broker_connection_retry_on_startup=True,
)


@scheduled_task(ordering_id="customer_id", uniqueness_key="step")
@app.task(name="reminders.send")
def send(customer_id: str, step: str, text: str) -> str:
    print(f"REMINDER {customer_id}: {step} - {text}", flush=True)
    return f"sent {step} to {customer_id}"


def schedule_examples(seconds_ahead: float = 5.0, run: str = "") -> list:
    """Schedule three reminders each for two customers, a second apart."""
    start = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=seconds_ahead)
    handles = []
    for customer in ("alice", "bob"):
        for n, step in enumerate(("welcome", "tips", "survey")):
            when = start + dt.timedelta(seconds=n)
            text = f"reminder {n + 1} of 3 {run}".strip()
            handles.append(send.schedule_at(when, customer, step, text=text))
    return handles


if __name__ == "__main__":
    for handle in schedule_examples():
        position = handle.wait()
        print(f"scheduled {handle.key} -> partition {position.partition}, offset {position.offset}")
