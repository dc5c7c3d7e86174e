"""Starting a dispatcher: which store errors are waited out and which are reported at once."""

from __future__ import annotations

import threading
import time

import pytest
from cassandra import AuthenticationFailed, DriverException
from cassandra.cluster import NoHostAvailable
from cassandra.protocol import ErrorMessage, OverloadedErrorMessage, ServerError, SyntaxException

from celery_scheduler.config import Settings
from celery_scheduler.dispatcher import service
from celery_scheduler.dispatcher.service import when_available
from celery_scheduler.errors import (
    ScheduleStoreError,
    SchemaMissingError,
    StoreUnavailableError,
    TaskLogUnavailableError,
    TopicMissingError,
)
from celery_scheduler.store.cassandra import translate_errors
from celery_scheduler.store.cqlsession import CqlSession


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


def test_the_servers_own_errors_are_typed_as_outages_or_rejections() -> None:
    """Found on a replicated cluster: a lease release raised a bare ErrorMessage
    (0x1700, a lightweight transaction's result unknown) that no caller expected."""
    for error in (ErrorMessage(0x1700, "CAS operation result is unknown", None),
                  OverloadedErrorMessage(0x1001, "overloaded", None),
                  ServerError(0x0000, "java.lang.RuntimeException", None)):
        with pytest.raises(StoreUnavailableError, match="could not release"), translate_errors("release"):
            raise error
    with pytest.raises(ScheduleStoreError, match="rejected") as raised, translate_errors("release"):
        raise SyntaxException(0x2000, "line 1:0 no viable alternative", None)
    assert not isinstance(raised.value, StoreUnavailableError)


class _ControlConnectionLost:
    def refresh_schema_metadata(self) -> None:
        raise DriverException("Schema metadata was not refreshed. See log for details.")


def test_a_cassandra_that_goes_away_while_the_schema_is_checked_is_an_outage() -> None:
    """A dispatcher restarted during a Cassandra restart connected, then lost the node before
    its schema check: that must be waited out, not end the dispatcher."""
    session = object.__new__(CqlSession)
    session.keyspace = "ks"
    session._cluster = _ControlConnectionLost()  # type: ignore[assignment]
    with pytest.raises(StoreUnavailableError, match="could not read the schema"):
        session.check_schema()


class _Store:
    def __init__(self, check_error: Exception | None) -> None:
        self.check_error = check_error
        self.closed = False

    def check_schema(self) -> None:
        if self.check_error is not None:
            raise self.check_error

    def close(self) -> None:
        self.closed = True


def test_the_schema_check_is_part_of_connecting(monkeypatch: pytest.MonkeyPatch) -> None:
    opened = [_Store(StoreUnavailableError("node restarting")), _Store(None)]
    handed = list(opened)
    monkeypatch.setattr(service, "open_store", lambda settings: handed.pop(0))
    store = when_available("Cassandra", lambda: service.open_checked_store(Settings()),
                           time.monotonic() + 30, threading.Event())
    assert store is opened[1] and not store.closed
    assert opened[0].closed  # the store whose check failed is not left connected


def test_an_old_schema_is_reported_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    old = _Store(SchemaMissingError("keeps task statuses in 'task_status'; run init"))
    monkeypatch.setattr(service, "open_store", lambda settings: old)
    with pytest.raises(SchemaMissingError, match="run init"):
        when_available("Cassandra", lambda: service.open_checked_store(Settings()),
                       time.monotonic() + 30, threading.Event())
    assert old.closed
