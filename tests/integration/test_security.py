"""Security properties, against the real services and real dispatcher and worker processes.

Covered elsewhere and not repeated: unsigned and forged records are dead-lettered and the
signing secret stays out of a DEBUG dispatcher log
(test_dispatch.py::test_signing_dead_letters_unsigned_and_forged_records); settings keep
passwords and signing keys out of their repr (tests/unit/test_config.py, test_signing.py).
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from celery_scheduler.api import ScheduleHandle
from celery_scheduler.config import Settings
from celery_scheduler.errors import StoreUnavailableError, TaskLogUnavailableError
from celery_scheduler.partitioner import partition_for
from celery_scheduler.store import open_store
from celery_scheduler.store.base import State
from tests.integration import dispatch_fixtures
from tests.integration.dispatch_fixtures import Scheduler
from tests.integration.raw_topic import (
    PARTITIONS,
    RawProducer,
    as_bytes,
    dead_letters,
    envelope,
    own_scheduler,
    scheduling_client,
)
from tests.services import CASSANDRA, REPO
from tests.waiting import wait_for_states, wait_until

# one test at a time among those that run a Kafka broker of their own (kafka_cluster's ports)
pytestmark = [pytest.mark.kafka, pytest.mark.cassandra, pytest.mark.redis,
              pytest.mark.xdist_group("own-kafka-broker")]

SECRETS = {"k1": "rotation-secret-one-0123456789", "k2": "rotation-secret-two-0123456789"}
REDIS_PASSWORD = "redis-pass-6e1f0c2a"
REDIS_PORT = 26379


@pytest.fixture
def secured(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dispatchers and workers run tests.apps.secured (tests.apps.dispatching plus settings)."""
    monkeypatch.setattr(dispatch_fixtures, "APP", "tests.apps.secured")


def now_utc() -> Any:
    import datetime as dt

    return dt.datetime.now(dt.timezone.utc)


class Canary:
    """Unpickling this runs a shell command that creates a file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.path}",))


def test_topic_records_can_neither_unpickle_nor_run_unscheduled_tasks(
        secured: None, kafka_bootstrap: str, redis_url: str, cassandra_contact: str,
        unique_name: str, tmp_path: Path) -> None:
    # the app pickles its own tasks: a released scheduled task must still travel as JSON
    with own_scheduler(tmp_path, kafka_bootstrap, unique_name,
                       CELERY_SCHEDULER_TEST_TASK_SERIALIZER="pickle") as scheduler, \
            scheduling_client(scheduler.env) as app:
        topic, partition = unique_name, partition_for("acct", PARTITIONS)
        producer = RawProducer(kafka_bootstrap, topic)
        opened = tmp_path / "unpickled"
        attacks = {
            producer.send(b"acct", pickle.dumps(Canary(opened)), partition): "record is not UTF-8",
            producer.send(b"acct", pickle.dumps(Canary(opened), protocol=0), partition): "record is not JSON",
            # tasks the worker would run, but that no @scheduled_task declares
            producer.send(b"acct", as_bytes(envelope("acct", 1, 0, task="dispatching.plain")), partition):
                "task 'dispatching.plain' is not a registered scheduled task",
            producer.send(b"acct", as_bytes(envelope("acct", 2, 0, task="celery.backend_cleanup",
                                                     args=[])), partition):
                "task 'celery.backend_cleanup' is not a registered scheduled task",
        }
        handle = app.record.schedule(("acct", 3), {}, at=now_utc())
        scheduler.dispatcher()

        # what reaches the Celery broker is a JSON message (no worker yet: it waits in the queue)
        broker = redis.Redis.from_url(f"{redis_url}/1")
        wait_until(lambda: broker.llen(unique_name) == 1, 45, handle.status)
        [raw] = broker.lrange(unique_name, 0, -1)
        message = json.loads(raw)
        assert message["content-type"] == "application/json"
        args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
        assert (args, kwargs, message["headers"]["task"]) == (["acct", 3], {}, "dispatching.record")

        scheduler.worker()
        wait_for_states([handle], State.SUCCEEDED, 45)
        reasons = dead_letters(kafka_bootstrap, topic, len(attacks))
        assert {source: reasons.get(source, "")[:len(why)] for source, why in attacks.items()} == attacks
        assert not opened.exists(), "a pickled record was unpickled"
        assert [(s["seq"], s.get("plain")) for s in scheduler.starts()] == [(3, None)]


def signed_by(scheduler: Scheduler, keys: dict[str, str], active: str) -> None:
    scheduler.env["CELERY_SCHEDULER_TEST_SIGNING_KEYS"] = json.dumps(keys)
    scheduler.env["CELERY_SCHEDULER_TEST_SIGNING_KEY_ID"] = active


def schedule_signed(scheduler: Scheduler, reader: Any, key_id: str, seq: int) -> ScheduleHandle:
    """Schedule ("r", seq) from a producer that signs with *key_id* only; *reader* asks statuses."""
    with scheduling_client(scheduler.env, signing_keys={key_id: SECRETS[key_id]},
                           signing_key_id=key_id) as app:
        handle = app.record.schedule(("r", seq), {}, at=now_utc())
    # the producer's client is closed: status queries go through one that stays open
    return ScheduleHandle(reader.record.client, handle.envelope, handle.wait())


def restart_dispatcher(scheduler: Scheduler, running: Any, keys: list[str], active: str) -> Any:
    if running is not None:
        running.terminate()  # hands its partitions over at once
        running.wait(30)
    signed_by(scheduler, {key_id: SECRETS[key_id] for key_id in keys}, active)
    return scheduler.dispatcher("--loglevel", "DEBUG")


def test_signing_key_rotation_end_to_end(secured: None, kafka_bootstrap: str, redis_url: str,
                                         cassandra_contact: str, unique_name: str, tmp_path: Path) -> None:
    with own_scheduler(tmp_path, kafka_bootstrap, unique_name) as scheduler, \
            scheduling_client(scheduler.env) as reader:
        scheduler.worker()
        # 1. everyone signs with k1
        dispatcher = restart_dispatcher(scheduler, None, ["k1"], "k1")
        wait_for_states([schedule_signed(scheduler, reader, "k1", 1)], State.SUCCEEDED, 45)
        # 2. k2 added everywhere and made active; a producer not yet updated still signs with k1
        dispatcher = restart_dispatcher(scheduler, dispatcher, ["k1", "k2"], "k2")
        wait_for_states([schedule_signed(scheduler, reader, "k1", 2),
                         schedule_signed(scheduler, reader, "k2", 3)], State.SUCCEEDED, 45)
        # 3. k1 removed: what it signs is refused from now on
        restart_dispatcher(scheduler, dispatcher, ["k2"], "k2")
        stale = schedule_signed(scheduler, reader, "k1", 4)
        wait_for_states([schedule_signed(scheduler, reader, "k2", 5)], State.SUCCEEDED, 45)

        [reason] = dead_letters(kafka_bootstrap, unique_name, 1).values()
        assert reason == "record is signed with unknown key 'k1'"
        assert stale.status() is None
        assert [s["seq"] for s in scheduler.starts()] == [1, 2, 3, 5]
        logs = "".join(scheduler.log_of(p) for p in scheduler.processes)
        assert all(secret not in logs for secret in SECRETS.values())


@pytest.fixture
def redis_with_password(tmp_path: Path) -> Iterator[str]:
    """A redis-server of this test's own that requires a password."""
    server = shutil.which("redis-server")
    if server is None:
        message = "redis-server is not installed (scripts/services up redis installs it)"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    process = subprocess.Popen([server, "--port", str(REDIS_PORT), "--bind", "127.0.0.1",
                                "--requirepass", REDIS_PASSWORD, "--save", "", "--appendonly", "no",
                                "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"redis://:{REDIS_PASSWORD}@127.0.0.1:{REDIS_PORT}"
    try:
        wait_until(lambda: _pings(url), 15, lambda: process.poll())
        yield url
    finally:
        process.terminate()
        process.wait(10)


def _pings(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_timeout=1).ping())
    except redis.RedisError:
        return False


def test_a_redis_password_from_config_works_end_to_end(
        secured: None, redis_with_password: str, kafka_bootstrap: str, cassandra_contact: str,
        unique_name: str, tmp_path: Path) -> None:
    with pytest.raises(redis.AuthenticationError):  # the server really requires it
        redis.Redis(port=REDIS_PORT).ping()
    # broker and result backend on the password-protected server
    with own_scheduler(tmp_path, kafka_bootstrap, unique_name,
                       CELERY_SCHEDULER_TEST_REDIS=redis_with_password) as scheduler, \
            scheduling_client(scheduler.env) as app:
        dispatcher = scheduler.dispatcher("--loglevel", "DEBUG")
        worker = scheduler.worker()
        handles = [app.record.schedule(("pw", seq), {}, at=now_utc()) for seq in range(3)]
        wait_for_states(handles, State.SUCCEEDED, 45)

        for process in (dispatcher, worker):
            assert REDIS_PASSWORD not in scheduler.log_of(process)

        scheduler.env["CELERY_SCHEDULER_TEST_REDIS"] = f"redis://:wrong-{REDIS_PASSWORD}@127.0.0.1:{REDIS_PORT}"
        check = scheduler.cli("dispatch", "--check")
        assert check.returncode == 1 and "unhealthy: broker:" in check.stderr
        assert REDIS_PASSWORD not in check.stdout + check.stderr


def test_cassandra_credentials_and_tls_reach_the_driver(cassandra_contact: str) -> None:
    host, port = CASSANDRA.rsplit(":", 1)
    settings = Settings.from_mapping({
        "scheduler_cassandra_contact_points": host, "scheduler_cassandra_port": int(port),
        "scheduler_cassandra_username": "scheduler", "scheduler_cassandra_password": "cass-pass-91d2",
        "scheduler_cassandra_request_timeout": 5.0})
    store = open_store(settings)  # this node does not ask for credentials; the driver has them
    try:
        auth = store._cluster.auth_provider  # type: ignore[attr-defined]
        assert (auth.username, auth.password) == ("scheduler", "cass-pass-91d2")
        assert "cass-pass-91d2" not in repr(store) + repr(settings)
    finally:
        store.close()
    # with TLS on, the driver opens a TLS connection, which this plaintext node cannot answer
    with pytest.raises(StoreUnavailableError, match=r"\[SSL") as refused:
        open_store(settings.replace(cassandra_ssl=True))
    assert "cass-pass-91d2" not in str(refused.value)


SASL_PASSWORD = "kafka-pass-5b7e"
SASL_LISTENER = "127.0.0.1:29096"


@pytest.fixture(scope="module")
def sasl_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Kafka node of this module's own (scripts/services, other ports and state) that
    also listens with SASL/PLAIN on 29096, for user ``scheduler``."""
    state = tmp_path_factory.mktemp("sasl-kafka")
    jaas = ("org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'user_scheduler="{SASL_PASSWORD}";')
    env = {**os.environ, "CELERY_SCHEDULER_STATE": str(state), "KAFKA_PORT": "29095",
           "KAFKA_CONTROLLER_PORT": "29195", "KAFKA_EXTRA_CONFIG": "\n".join([
               f"listeners=PLAINTEXT://127.0.0.1:29095,CONTROLLER://127.0.0.1:29195,"
               f"SASL_PLAINTEXT://{SASL_LISTENER}",
               f"advertised.listeners=PLAINTEXT://127.0.0.1:29095,SASL_PLAINTEXT://{SASL_LISTENER}",
               "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,"
               "SASL_PLAINTEXT:SASL_PLAINTEXT",
               "sasl.enabled.mechanisms=PLAIN",
               f"listener.name.sasl_plaintext.plain.sasl.jaas.config={jaas}"])}
    services = [str(REPO / "scripts" / "services")]
    started = subprocess.run([*services, "up", "kafka"], env=env, capture_output=True, text=True,
                             timeout=240)
    try:
        if started.returncode != 0:
            message = f"the SASL Kafka node did not start:\n{started.stderr[-3000:]}"
            if os.environ.get("CI"):
                pytest.fail(message, pytrace=False)
            pytest.skip(message)
        yield SASL_LISTENER
    finally:
        subprocess.run([*services, "down", "kafka"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(state, ignore_errors=True)


def sasl(password: str) -> dict[str, str]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
            "sasl.username": "scheduler", "sasl.password": password}


def test_kafka_sasl_settings_from_config_work_end_to_end(
        secured: None, sasl_kafka: str, cassandra_contact: str, redis_url: str, unique_name: str,
        tmp_path: Path) -> None:
    options = json.dumps(sasl(SASL_PASSWORD))
    # init (admin client), the dispatcher (consumer, dead-letter producer) and the schedule
    # call (producer) all reach the broker through the SASL listener only
    with own_scheduler(tmp_path, sasl_kafka, unique_name,
                       CELERY_SCHEDULER_TEST_KAFKA_OPTIONS=options) as scheduler, \
            scheduling_client(scheduler.env, kafka_options=sasl(SASL_PASSWORD)) as app:
        dispatcher = scheduler.dispatcher("--loglevel", "DEBUG")
        worker = scheduler.worker()
        handle = app.record.schedule(("sasl", 1), {}, at=now_utc())
        wait_for_states([handle], State.SUCCEEDED, 45)

        scheduler.env["CELERY_SCHEDULER_TEST_KAFKA_OPTIONS"] = json.dumps(sasl("wrong-password"))
        check = scheduler.cli("dispatch", "--check")
        assert check.returncode == 1 and "unhealthy: kafka" in check.stderr, check.stderr
        logs = scheduler.log_of(dispatcher) + scheduler.log_of(worker) + check.stdout + check.stderr
        assert SASL_PASSWORD not in logs

    with scheduling_client(scheduler.env, kafka_options=sasl("wrong-password"),
                           kafka_produce_timeout=3.0) as app, \
            pytest.raises(TaskLogUnavailableError) as refused:
        app.record.schedule(("sasl", 2), {}, countdown=60)
    assert "wrong-password" not in str(refused.value)
