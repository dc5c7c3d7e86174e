"""``python -m benchmarks.instant_worker``: a stand-in for Celery workers that does no work.

It takes the released messages straight off the stack's Redis queue (``RPOP`` of up to
PREFETCH documents at a time, oldest first, as kombu's Redis transport stores them) and,
for each, logs the start in the execution log and reports success to the outcomes topic at
once, through the package's own outcome producer, as a worker's hook would after a task
that takes no time. With it the dispatcher, Kafka and Cassandra are the whole pipeline:
scenario 8 measures their ceiling.

It reads Redis directly rather than through a kombu consumer: kombu's consumer keeps each
message in its unacknowledged set until the ack (two more Redis commands a message) and
builds a message object for it, which cost this process 1.27 ms of CPU a task, more than
the dispatcher it stands in front of. A message taken is gone: nothing here fails.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import redis

from benchmarks.app import EXECLOG, RELEASED_HEADER, app
from benchmarks.execlog import start_line
from celery_scheduler.config import get_settings
from celery_scheduler.wire import HEADER, Outcome, parse_header
from celery_scheduler.worker import OutcomeProducer

PREFETCH = 2000
WAIT_SECONDS = 0.5


def queue_keys() -> list[str]:
    """The Redis lists of the default queue, one per priority step, as kombu names them."""
    queue = app.conf.task_default_queue
    with app.connection_for_read() as connection:
        channel = connection.default_channel
        return [channel._q_for_pri(queue, priority)  # type: ignore[attr-defined]  # kombu Redis
            for priority in channel.priority_steps]  # type: ignore[attr-defined]


def handle(documents: list[bytes], producer: OutcomeProducer) -> None:
    """Log each released task of *documents* as started and report its success."""
    lines = []
    for raw in documents:
        document = json.loads(raw)
        headers = document.get("headers") or {}
        release = parse_header(headers.get(HEADER))
        body = json.loads(base64.b64decode(document["body"]))
        args = body[0] if isinstance(body, list) and body else []
        if release is None or len(args) < 3:
            continue
        released = headers.get(RELEASED_HEADER)
        lines.append(start_line(args[0], args[1], args[2],
                                released if isinstance(released, float) else None))
        producer.send(Outcome(release.key, release.partition, release.attempt, True, None))
    if lines and EXECLOG:
        with open(EXECLOG, "a") as log:
            log.write("".join(lines))


def main() -> int:
    producer = OutcomeProducer(get_settings(app))
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    keys = queue_keys()
    client = redis.Redis.from_url(app.conf.broker_url)
    marker = os.environ.get("BENCH_READY_FILE")
    if marker:
        Path(marker).touch()
    while not stopping.is_set():
        taken: list[Any] = []
        for key in keys:  # the highest priority first, as kombu reads them
            taken += client.rpop(key, PREFETCH) or []
        if not taken:
            popped = client.brpop(keys, timeout=WAIT_SECONDS)
            taken = [popped[1]] if popped else []
        handle(taken, producer)
    producer.flush(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
