"""Access to the local services for tests: addresses, and a gate that fails in CI.

Tests that need Kafka, Cassandra or Redis ask for the matching fixture. When the service
does not answer, the test is skipped on a developer machine (with the command that starts
it) but fails when ``CI`` is set, so a broken service can never turn into a green run.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent
KAFKA = os.environ.get("CELERY_SCHEDULER_TEST_KAFKA", "127.0.0.1:9092")
CASSANDRA = os.environ.get("CELERY_SCHEDULER_TEST_CASSANDRA", "127.0.0.1:9042")
REDIS = os.environ.get("CELERY_SCHEDULER_TEST_REDIS", "redis://127.0.0.1:6379")
RABBITMQ = os.environ.get("CELERY_SCHEDULER_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672//")
ADDRESSES = {"kafka": KAFKA, "cassandra": CASSANDRA, "redis": REDIS.split("://", 1)[-1],
             "rabbitmq": RABBITMQ.split("@", 1)[-1].rstrip("/")}


def _load_probe() -> ModuleType:
    # The readiness probes live with the service script so it can run before the package
    # is installed; load that file rather than keep a second copy here.
    spec = importlib.util.spec_from_file_location("_probe", REPO / "scripts" / "probe.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_probe = _load_probe()
_answers: dict[str, str | BaseException] = {}


def require(service: str) -> str:
    """Return the service's address, or fail (CI) / skip (elsewhere) when it is down."""
    if service not in _answers:
        try:
            _answers[service] = _probe.PROBES[service](ADDRESSES[service])
        except Exception as exc:
            _answers[service] = exc
    answer = _answers[service]
    if isinstance(answer, BaseException):
        message = (
            f"{service} at {ADDRESSES[service]} is not answering ({answer!r}); "
            f"start it with `scripts/services up {service}`"
        )
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return ADDRESSES[service]


def drop_scheduler(topic: str, keyspace: str) -> None:
    """Delete a test's scheduler topics and keyspace, so the services do not fill up."""
    from cassandra.cluster import Cluster
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": KAFKA})
    topics = [topic, f"{topic}.deadletter", f"{topic}.outcomes"]
    for future in admin.delete_topics(topics, operation_timeout=30).values():
        with contextlib.suppress(Exception):  # never created, or already gone
            future.result(30)
    host, port = CASSANDRA.rsplit(":", 1)
    cluster = Cluster([host], port=int(port))
    try:
        cluster.connect().execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)
    finally:
        cluster.shutdown()
