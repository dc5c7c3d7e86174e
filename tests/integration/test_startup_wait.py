"""A dispatcher started before Cassandra answers waits for it, then works; it gives up in time.

Supervisors start a dispatcher beside its services, and restart it while one of them
restarts: it must not exit at once (and be restarted in a loop) but wait, as a Celery worker
waits for its broker, for at most ``scheduler_startup_timeout``.

Cassandra here is the real one, reached through a forwarder on a port of its own that
starts listening only when the test says so.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest

from tests.integration.dispatch_fixtures import Scheduler
from tests.integration.dispatch_fixtures import schedule as schedule
from tests.integration.dispatch_fixtures import scheduler as scheduler
from tests.waiting import wait_until


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Forwarder:
    """Forwards 127.0.0.1:*port* to *target* once :meth:`open` is called; refuses before."""

    def __init__(self, port: int, target: tuple[str, int]) -> None:
        self.port, self.target = port, target
        self._server: socket.socket | None = None
        self._sockets: list[socket.socket] = []

    def open(self) -> None:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.port))
        server.listen(16)
        self._server = server
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        assert self._server is not None
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self._sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def close(self) -> None:
        for s in ([self._server] if self._server else []) + self._sockets:
            s.close()


@pytest.fixture
def forwarder(cassandra_contact: str) -> Iterator[Forwarder]:
    host, _, port = cassandra_contact.rpartition(":")
    forwarder = Forwarder(free_port(), (host or "127.0.0.1", int(port or 9042)))
    yield forwarder
    forwarder.close()


def test_a_dispatcher_waits_for_cassandra_then_releases(forwarder: Forwarder, scheduler: Scheduler,
                                                         schedule) -> None:
    scheduler.env["CELERY_SCHEDULER_TEST_CASSANDRA_PORT"] = str(forwarder.port)
    dispatcher = scheduler.dispatcher(wait=False)
    scheduler.wait_for_log(dispatcher, "Cassandra is not available yet", timeout=60)
    scheduler.worker()
    due = time.time() + 1
    schedule.record.schedule(("w", 0), {}, at=datetime.fromtimestamp(due, timezone.utc))
    # still waiting after the task fell due: a later "not available" line than that
    wait_until(lambda: time.time() > due, 10, "the due time")
    waited = scheduler.log_of(dispatcher).count("Cassandra is not available yet")
    wait_until(lambda: scheduler.log_of(dispatcher).count("Cassandra is not available yet") > waited,
               30, lambda: scheduler.log_of(dispatcher)[-2000:])
    assert dispatcher.poll() is None, scheduler.log_of(dispatcher)
    assert scheduler.starts() == []

    forwarder.open()
    scheduler.wait_for_log(dispatcher, "leased partition", timeout=60)
    scheduler.wait_for_starts(1, timeout=60)
    assert [(s["o"], s["seq"]) for s in scheduler.starts()] == [("w", 0)]


def test_a_dispatcher_gives_up_after_the_startup_timeout(scheduler: Scheduler) -> None:
    scheduler.env["CELERY_SCHEDULER_TEST_CASSANDRA_PORT"] = str(free_port())  # nothing listens
    scheduler.env["CELERY_SCHEDULER_TEST_STARTUP_TIMEOUT"] = "3"
    started = time.monotonic()
    dispatcher = scheduler.dispatcher(wait=False)
    assert dispatcher.wait(timeout=60) == 1
    elapsed = time.monotonic() - started
    log = scheduler.log_of(dispatcher)
    assert "Cassandra is not available yet" in log and "scheduler_startup_timeout" in log
    assert "Cassandra could not connect" in log
    assert elapsed >= 3, elapsed
