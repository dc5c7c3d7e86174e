"""Starting a dispatcher: which store errors are waited out and which are reported at once."""

from __future__ import annotations

import threading
import time

import pytest
from cassandra import AuthenticationFailed
from cassandra.cluster import NoHostAvailable

from celery_scheduler.dispatcher.service import when_available
from celery_scheduler.errors import (
    ScheduleStoreError,
    StoreUnavailableError,
    TaskLogUnavailableError,
    TopicMissingError,
)
from celery_scheduler.store.cassandra import translate_errors


def test_an_outage_is_waited_out() -> None:
    failures = [StoreUnavailableError("down"), TaskLogUnavailableError("down")]

    def connect() -> str:
        if failures:
            raise failures.pop(0)
        return "connected"

    started = time.monotonic()
    assert when_available("Cassandra", connect, time.monotonic() + 30, threading.Event()) == "connected"
    assert failures == [] and time.monotonic() - started >= 0.5 + 1.0  # backed off twice


def test_the_last_outage_error_is_raised_at_the_deadline() -> None:
    def connect() -> str:
        raise StoreUnavailableError("still down")

    started = time.monotonic()
    with pytest.raises(StoreUnavailableError, match="still down"):
        when_available("Cassandra", connect, time.monotonic() + 1.2, threading.Event())
    assert 1.2 <= time.monotonic() - started < 5


def test_errors_waiting_cannot_cure_are_raised_at_once() -> None:
    calls = []

    def connect() -> str:
        calls.append(1)
        raise TopicMissingError("no topic; run scheduler init")

    with pytest.raises(TopicMissingError):
        when_available("Kafka", connect, time.monotonic() + 30, threading.Event())
    assert calls == [1]


def test_a_stop_request_ends_the_wait() -> None:
    stopping = threading.Event()
    stopping.set()
    with pytest.raises(StoreUnavailableError):
        when_available("Cassandra", lambda: (_ for _ in ()).throw(StoreUnavailableError("down")),
                       time.monotonic() + 30, stopping)


def test_refused_credentials_are_not_an_outage() -> None:
    refused = NoHostAvailable("Unable to connect to any servers",
                              {"127.0.0.1:9042": AuthenticationFailed("bad credentials")})
    with pytest.raises(ScheduleStoreError, match="refused the credentials") as raised, \
            translate_errors("connect"):
        raise refused
    assert not isinstance(raised.value, StoreUnavailableError)

    down = NoHostAvailable("Unable to connect to any servers",
                           {"127.0.0.1:9042": ConnectionRefusedError(111, "refused")})
    with pytest.raises(StoreUnavailableError, match="could not connect"), translate_errors("connect"):
        raise down
