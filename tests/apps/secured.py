"""tests.apps.dispatching with settings the security and replication tests vary, from the environment.

``CELERY_SCHEDULER_TEST_SIGNING_KEYS`` (JSON object) with ``..._SIGNING_KEY_ID``,
``..._KAFKA_OPTIONS`` (JSON object of librdkafka settings) and ``..._REPLICATION_FACTOR``.
It also defines an ordinary Celery task that is *not* a scheduled task, which no dispatcher
may release.
"""

from __future__ import annotations

import json
import os

from tests.apps.dispatching import app, log, record  # noqa: F401  (the scheduled tasks)

if os.environ.get("CELERY_SCHEDULER_TEST_SIGNING_KEYS"):
    app.conf.scheduler_signing_keys = json.loads(os.environ["CELERY_SCHEDULER_TEST_SIGNING_KEYS"])
    app.conf.scheduler_signing_key_id = os.environ["CELERY_SCHEDULER_TEST_SIGNING_KEY_ID"]
if os.environ.get("CELERY_SCHEDULER_TEST_REPLICATION_FACTOR"):
    app.conf.scheduler_kafka_replication_factor = int(os.environ["CELERY_SCHEDULER_TEST_REPLICATION_FACTOR"])
if os.environ.get("CELERY_SCHEDULER_TEST_KAFKA_OPTIONS"):
    app.conf.scheduler_kafka_options = json.loads(os.environ["CELERY_SCHEDULER_TEST_KAFKA_OPTIONS"])


@app.task(name="dispatching.plain")
def plain(ordering_id: str, seq: int) -> int:
    """An ordinary Celery task: callable with delay(), never released by a dispatcher."""
    log("start", ordering_id, seq, plain=True)
    log("end", ordering_id, seq)
    return seq
