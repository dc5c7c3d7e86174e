"""A Celery app with scheduled tasks whose topic and keyspace come from the environment.

Tests point ``CELERY_SCHEDULER_TEST_TOPIC`` / ``CELERY_SCHEDULER_TEST_KEYSPACE`` at names of
their own, so that the CLI run as a subprocess sees the same configuration.
"""

from __future__ import annotations

import os

from celery import Celery

from celery_scheduler import scheduled_task

REDIS_URL = os.environ.get("CELERY_SCHEDULER_TEST_REDIS", "redis://127.0.0.1:6379")

app = Celery("scheduling", broker=f"{REDIS_URL}/1", backend=f"{REDIS_URL}/2")
app.conf.update(
    scheduler_kafka_bootstrap_servers=os.environ.get("CELERY_SCHEDULER_TEST_KAFKA", "127.0.0.1:9092"),
    scheduler_kafka_topic=os.environ.get("CELERY_SCHEDULER_TEST_TOPIC", "celery_scheduler_tests"),
    scheduler_kafka_partitions=6,
    scheduler_kafka_produce_timeout=15.0,
    scheduler_cassandra_contact_points=os.environ.get("CELERY_SCHEDULER_TEST_CASSANDRA_HOST", "127.0.0.1"),
    scheduler_cassandra_keyspace=os.environ.get("CELERY_SCHEDULER_TEST_KEYSPACE", "celery_scheduler_tests"),
    scheduler_cassandra_consistency="ONE",
    task_default_queue=os.environ.get("CELERY_SCHEDULER_TEST_QUEUE", "scheduling"),
    broker_connection_retry_on_startup=True,
)


@scheduled_task(ordering_id="customer_id", uniqueness_key="kind")
@app.task(name="scheduling.remind")
def remind(customer_id: str, kind: str = "default") -> str:
    return f"{customer_id}:{kind}"
