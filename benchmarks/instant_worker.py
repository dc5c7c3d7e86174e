"""``python -m benchmarks.instant_worker``: a stand-in for Celery workers that does no work.

It reads the released messages from the stack's queue and, for each, logs the start in the
execution log and reports success to the outcomes topic at once, through the package's own
outcome producer, as a worker's hook would after a task that takes no time. With it the
dispatcher, Kafka and Cassandra are the whole pipeline: scenario 8 measures their ceiling.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from kombu.messaging import Consumer

from benchmarks.app import EXECLOG, RELEASED_HEADER, app
from benchmarks.execlog import write_start
from celery_scheduler.config import get_settings
from celery_scheduler.wire import HEADER, Outcome, parse_header
from celery_scheduler.worker import OutcomeProducer

PREFETCH = 2000


def main() -> int:
    producer = OutcomeProducer(get_settings(app))
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    queue = app.amqp.queues[app.conf.task_default_queue]

    def on_message(body: Any, message: Any) -> None:
        headers = message.headers or {}
        release = parse_header(headers.get(HEADER))
        args = body[0] if isinstance(body, (list, tuple)) and body else []
        if release is not None and len(args) >= 3:
            released = headers.get(RELEASED_HEADER)
            write_start(EXECLOG, args[0], args[1], args[2],
                        released if isinstance(released, float) else None)
            producer.send(Outcome(release.key, release.partition, release.attempt, True, None))
        message.ack()

    with app.connection_for_read() as connection:
        consumer = Consumer(connection, queues=[queue], callbacks=[on_message], accept=["json"],  # type: ignore[no-untyped-call]
                            prefetch_count=PREFETCH)
        with consumer:
            marker = os.environ.get("BENCH_READY_FILE")
            if marker:
                Path(marker).touch()
            while not stopping.is_set():
                try:
                    connection.drain_events(timeout=0.5)
                except TimeoutError:
                    continue
    producer.flush(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
