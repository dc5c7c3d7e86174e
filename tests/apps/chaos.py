"""The app the chaos harness runs: one scheduled task that logs each execution.

Everything comes from the environment the harness sets, so dispatchers and workers talk to
the harness's own Kafka, Cassandra and broker (which it restarts at will):

- ``CELERY_SCHEDULER_CHAOS_KAFKA``, ``CELERY_SCHEDULER_CHAOS_CASSANDRA_PORT``,
  ``CELERY_SCHEDULER_CHAOS_BROKER`` (a Redis or RabbitMQ URL): where the services are;
- ``CELERY_SCHEDULER_TEST_TOPIC``/``_KEYSPACE``/``_QUEUE``/``_EXECLOG``: as for
  ``tests.apps.dispatching``, so ``tests.integration.dispatch_fixtures.Scheduler`` drives it;
- ``CELERY_SCHEDULER_CHAOS_MUTANT``: a deliberately broken dispatcher (see :func:`_mutate`),
  to show that the harness notices when a guarantee is broken.

Each execution appends a ``start`` and an ``end`` line (JSON) to the execution log, with the
release's partition, lease epoch and attempt from the message header.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

from celery import Celery
from confluent_kafka import KafkaException, TopicPartition

from celery_scheduler import scheduled_task
from celery_scheduler.wire import HEADER, parse_header
from tests.apps.dispatching import log, unique_seq

BROKER_URL = os.environ.get("CELERY_SCHEDULER_CHAOS_BROKER", "redis://127.0.0.1:16379/1")
# Mutant: the dispatcher commits Kafka offsets before it writes the batch to Cassandra.
MUTANT_COMMIT_FIRST = "commit-before-persist"

app = Celery("chaos", broker=BROKER_URL)
app.conf.update(
    scheduler_kafka_bootstrap_servers=os.environ.get("CELERY_SCHEDULER_CHAOS_KAFKA", "127.0.0.1:19092"),
    scheduler_kafka_topic=os.environ.get("CELERY_SCHEDULER_TEST_TOPIC", "celery_scheduler_chaos"),
    scheduler_kafka_partitions=int(os.environ.get("CELERY_SCHEDULER_TEST_PARTITIONS", "6")),
    scheduler_kafka_produce_timeout=5.0,
    scheduler_cassandra_port=int(os.environ.get("CELERY_SCHEDULER_CHAOS_CASSANDRA_PORT", "19042")),
    scheduler_cassandra_keyspace=os.environ.get("CELERY_SCHEDULER_TEST_KEYSPACE", "celery_scheduler_chaos"),
    scheduler_cassandra_consistency="ONE",
    scheduler_cassandra_serial_consistency="SERIAL",
    scheduler_cassandra_request_timeout=5.0,
    scheduler_lease_seconds=float(os.environ.get("CELERY_SCHEDULER_TEST_LEASE", "10")),
    scheduler_partition_lease_seconds=float(os.environ.get("CELERY_SCHEDULER_TEST_PARTITION_LEASE", "6")),
    scheduler_retry_backoff=0.2,
    scheduler_retry_backoff_max=1.0,
    scheduler_max_attempts=int(os.environ.get("CELERY_SCHEDULER_CHAOS_ATTEMPTS", "100")),
    task_default_queue=os.environ.get("CELERY_SCHEDULER_TEST_QUEUE", "chaos"),
    broker_connection_retry_on_startup=True,
    broker_connection_max_retries=None,
    worker_hijack_root_logger=False,
    worker_prefetch_multiplier=1,
    # on RabbitMQ, a message is taken off the queue only once its run ended (README: Brokers)
    task_acks_late=BROKER_URL.startswith("amqp"),
)


@scheduled_task(ordering_id="ordering_id", uniqueness_key=unique_seq)
@app.task(name="chaos.record", bind=True)
def record(self: Any, ordering_id: str, seq: int, duration: float = 0.0,
           scheduled_for: float = 0.0) -> int:
    release = parse_header(getattr(self.request, HEADER, None))
    where = {} if release is None else {"p": release.partition, "e": release.epoch,
                                        "a": release.attempt}
    log("start", ordering_id, seq, scheduled_for=scheduled_for, **where)
    if duration:
        time.sleep(duration)
    log("end", ordering_id, seq)
    return seq


class _CommitFirst:
    """A Kafka consumer that commits each batch as soon as it has read it (the mutant)."""

    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer

    def consume(self, *args: Any, **kwargs: Any) -> Any:
        messages = self._consumer.consume(*args, **kwargs)
        if messages:
            past = {(m.topic(), m.partition()): m.offset() + 1 for m in messages if not m.error()}
            offsets = [TopicPartition(topic, partition, offset)
                       for (topic, partition), offset in past.items()]
            # on the Kafka consumer behind the reader port, so the commit is done when it returns
            with contextlib.suppress(KafkaException):  # revoked meanwhile
                self._consumer.consumer.commit(offsets=offsets, asynchronous=False)
            time.sleep(1.0)  # a slow Cassandra write after the commit: a kill lands here
        return messages

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


def _mutate() -> None:
    """Break the dispatcher's ingest: Kafka offsets are committed BEFORE the Cassandra write.

    Patched in this module, which only harness processes import; the package is untouched.
    """
    from celery_scheduler.dispatcher.ingest import Ingest

    init = Ingest.__init__

    def wrapped_init(self: Ingest, consumer: Any, *args: Any, **kwargs: Any) -> None:
        init(self, _CommitFirst(consumer), *args, **kwargs)

    Ingest.__init__ = wrapped_init  # type: ignore[method-assign]


if os.environ.get("CELERY_SCHEDULER_CHAOS_MUTANT") == MUTANT_COMMIT_FIRST:
    _mutate()
