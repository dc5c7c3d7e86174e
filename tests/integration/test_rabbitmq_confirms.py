"""Releases to a real RabbitMQ count as sent only once RabbitMQ confirmed them.

The publisher sends a step's releases one after the other and waits once for all the
confirms. A message RabbitMQ refuses (here: a full queue set to reject publishes) is not
sent, and is sent again; one whose confirm never comes back (the connection goes quiet
through a proxy the test controls) is uncertain, and waits for its lease.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from celery import Celery
from kombu import Connection, Queue

from celery_scheduler.envelope import ScheduleEnvelope
from celery_scheduler.errors import ReleaseNotSentError, ReleaseUncertainError
from celery_scheduler.keys import TaskKey
from celery_scheduler.release import Publisher
from celery_scheduler.release import publisher as releasing
from celery_scheduler.release.confirms import Unconfirmed
from celery_scheduler.wire import Release

pytestmark = [pytest.mark.rabbitmq]

NOW = 1_893_456_000_000


class Proxy:
    """A TCP proxy to RabbitMQ whose replies can be held back (a broker that went quiet)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.quiet = threading.Event()
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, reply: bool) -> None:
        try:
            while data := source.recv(65536):
                if reply and self.quiet.is_set():
                    continue  # swallowed: the client never hears back
                sink.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        self.listener.close()
        for sock in self.sockets:
            sock.close()

    def sever(self) -> None:
        """Reset every connection and refuse new ones: a broker gone away."""
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() in progress
        self.listener.close()
        self.reset()

    def reset(self) -> None:
        """Reset every connection, and take new ones: a broker restarted at once."""
        sockets, self.sockets = self.sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def _app(url: str, queue: Queue) -> Celery:
    app = Celery("confirms", broker=url, set_as_current=False)
    app.conf.update(task_default_queue=queue.name, task_queues=[queue], broker_connection_timeout=2,
                    broker_connection_max_retries=1)
    return app


def _items(queue: str, first: int, count: int) -> list[tuple[ScheduleEnvelope, Release]]:
    items = []
    for i in range(first, first + count):
        key = TaskKey(f"o{i}", NOW, "u")
        envelope = ScheduleEnvelope(key, "confirms.record", args=[i], options={"queue": queue})
        items.append((envelope, Release(key, i % 6, 1, 1)))
    return items


def queued_task_ids(url: str, queue: Queue) -> list[str]:
    ids: list[str] = []
    with Connection(url) as connection:
        bound = queue(connection.default_channel)
        while (message := bound.get(no_ack=True)) is not None:
            ids.append(message.headers["id"])
    return ids


@pytest.fixture
def queue(rabbitmq_url: str, unique_name: str) -> Iterator[Queue]:
    declared = Queue(unique_name, routing_key=unique_name, auto_delete=False)
    yield declared
    with Connection(rabbitmq_url) as connection:
        declared(connection.default_channel).delete()


def test_a_step_of_releases_is_confirmed_whole_and_queued_in_order(rabbitmq_url: str,
                                                                   queue: Queue) -> None:
    publisher = Publisher(_app(rabbitmq_url, queue))
    try:
        items = _items(queue.name, 0, 200)
        assert publisher.publish_many(items) == [None] * 200
        publisher.publish(*_items(queue.name, 200, 1)[0])  # one alone goes the same way
        assert publisher._confirms is not None  # the producer is in confirm mode
    finally:
        publisher.close()
    expected = [release.key.task_id for _, release in _items(queue.name, 0, 201)]
    assert queued_task_ids(rabbitmq_url, queue) == expected


def test_messages_rabbitmq_refuses_are_not_sent(rabbitmq_url: str, unique_name: str) -> None:
    # a queue of three messages at most, which refuses (nacks) publishes beyond that
    full = Queue(unique_name, routing_key=unique_name, auto_delete=False,
                 queue_arguments={"x-max-length": 3, "x-overflow": "reject-publish"})
    publisher = Publisher(_app(rabbitmq_url, full))
    try:
        results = publisher.publish_many(_items(full.name, 0, 5))
        assert results[:3] == [None] * 3
        assert all(isinstance(e, ReleaseNotSentError) and "refused" in str(e) for e in results[3:])
        with pytest.raises(ReleaseNotSentError):
            publisher.publish(*_items(full.name, 5, 1)[0])
        assert len(queued_task_ids(rabbitmq_url, full)) == 3
        # the queue has room again: the refused ones go through on the same channel
        assert publisher.publish_many(_items(full.name, 3, 2)) == [None, None]
    finally:
        publisher.close()
        with Connection(rabbitmq_url) as connection:
            full(connection.default_channel).delete()


@pytest.fixture
def proxied(rabbitmq_url: str, queue: Queue, monkeypatch: pytest.MonkeyPatch
            ) -> Iterator[tuple[Publisher, Proxy]]:
    """A publisher that reaches RabbitMQ through a Proxy, and waits 1 s for a confirm."""
    monkeypatch.setattr(releasing, "CONFIRM_TIMEOUT_SECONDS", 1.0)
    host, port = rabbitmq_url.rsplit("@", 1)[1].rstrip("/").split(":")
    proxy = Proxy((host, int(port)))
    url = f"{rabbitmq_url.rsplit('@', 1)[0]}@127.0.0.1:{proxy.port}//"
    publisher = Publisher(_app(url, queue))
    try:
        yield publisher, proxy
    finally:
        publisher.close()
        proxy.close()


def test_releases_whose_confirm_never_comes_are_uncertain(rabbitmq_url: str, queue: Queue,
                                                         proxied: tuple[Publisher, Proxy]) -> None:
    publisher, proxy = proxied
    assert publisher.publish_many(_items(queue.name, 0, 1)) == [None]
    proxy.quiet.set()
    results = publisher.publish_many(_items(queue.name, 1, 20))
    # sent, but RabbitMQ's confirms did not come back: it may have taken any of them
    assert len(results) == 20 and all(isinstance(e, ReleaseUncertainError) for e in results)
    proxy.quiet.clear()
    # a fresh connection and channel in confirm mode after the failure
    assert publisher.publish_many(_items(queue.name, 21, 5)) == [None] * 5
    queued = queued_task_ids(rabbitmq_url, queue)
    # the quiet batch reached RabbitMQ all the same: uncertain was the right answer
    assert len(queued) == 26


def test_releases_without_a_broker_are_not_sent(unique_name: str) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    queue = Queue(unique_name)
    publisher = Publisher(_app(f"amqp://guest:guest@127.0.0.1:{port}//", queue))
    results = publisher.publish_many(_items(queue.name, 0, 3))
    assert len(results) == 3 and all(isinstance(e, ReleaseNotSentError) for e in results)


def _collected(publisher: Publisher, results: list[object], timeout: float = 10.0) -> list[object]:
    """*results* once every Unconfirmed among them is settled, read as the dispatcher's sender
    reads them; each as its final result."""
    deadline = time.monotonic() + timeout
    while any(isinstance(r, Unconfirmed) and not r.done for r in results):
        assert time.monotonic() < deadline, "RabbitMQ's confirms were never read"
        publisher.collect_confirms(0.05)
    return [r.result if isinstance(r, Unconfirmed) else r for r in results]


def test_releases_confirmed_later_are_settled_as_rabbitmq_answers(rabbitmq_url: str,
                                                                 unique_name: str) -> None:
    full = Queue(unique_name, routing_key=unique_name, auto_delete=False,
                 queue_arguments={"x-max-length": 3, "x-overflow": "reject-publish"})
    publisher = Publisher(_app(rabbitmq_url, full))
    try:
        first = publisher.publish_many(_items(full.name, 0, 2), confirm_later=True)
        # a second step goes out before the first one's confirms were read
        second = publisher.publish_many(_items(full.name, 2, 3), confirm_later=True)
        assert all(isinstance(r, Unconfirmed) for r in first + second)
        # py-amqp reads answers at each publish: some may be settled already
        assert publisher.unconfirmed <= 5
        assert _collected(publisher, first) == [None, None]
        results = _collected(publisher, second)
        assert results[0] is None  # the third message fills the queue; the rest are refused
        assert all(isinstance(e, ReleaseNotSentError) and "refused" in str(e)
                   for e in results[1:]), results
        assert publisher.unconfirmed == 0
    finally:
        publisher.close()
        with Connection(rabbitmq_url) as connection:
            full(connection.default_channel).delete()


def test_releases_confirmed_later_whose_confirm_never_comes_are_uncertain(
        queue: Queue, proxied: tuple[Publisher, Proxy]) -> None:
    publisher, proxy = proxied
    assert _collected(publisher, publisher.publish_many(_items(queue.name, 0, 1),
                                                        confirm_later=True)) == [None]
    proxy.quiet.set()
    started = time.monotonic()
    results = _collected(publisher, publisher.publish_many(_items(queue.name, 1, 5), confirm_later=True))
    assert all(isinstance(e, ReleaseUncertainError) for e in results)
    assert 1.0 <= time.monotonic() - started < 5.0
    # one let go with its connection is uncertain too
    proxy.quiet.clear()
    pending = publisher.publish_many(_items(queue.name, 6, 2), confirm_later=True)
    publisher.close()
    assert all(isinstance(r, Unconfirmed) and isinstance(r.result, ReleaseUncertainError)
               for r in pending)


def _cut_short(publisher: Publisher, cut: Callable[[], None], queue: Queue) -> list[object]:
    """Publish a step of releases after *cut* broke the connection; each step's results,
    checked: the publish that found it broken may have reached RabbitMQ, the ones after it
    certainly did not, and those before it (written before the failure was seen) wait for
    confirms that will not come."""
    cut()
    time.sleep(0.2)
    results = publisher.publish_many(_items(queue.name, 1, 50), confirm_later=True)
    failed = next(i for i, r in enumerate(results) if not isinstance(r, Unconfirmed))
    assert isinstance(results[failed], ReleaseUncertainError), results
    assert all(isinstance(e, ReleaseNotSentError) for e in results[failed + 1:]), results
    return results[:failed]


def test_releases_to_a_broker_that_went_away_are_reported_not_raised(
        queue: Queue, proxied: tuple[Publisher, Proxy]) -> None:
    publisher, proxy = proxied
    assert publisher.publish_many(_items(queue.name, 0, 1), confirm_later=True)
    # when: the broker goes away (its connections reset, new ones refused), as in a restart,
    # and kombu's own reconnection fails meanwhile, dropping the producer's connection
    before = _cut_short(publisher, proxy.sever, queue)
    # then: each release is reported, none raised
    assert all(isinstance(r, Unconfirmed) and isinstance(r.result, ReleaseUncertainError)
               for r in before)
    assert publisher.unconfirmed == 0


def test_releases_after_a_reset_connection_go_out_on_a_new_channel_in_confirm_mode(
        rabbitmq_url: str, queue: Queue, proxied: tuple[Publisher, Proxy]) -> None:
    publisher, proxy = proxied
    assert _collected(publisher, publisher.publish_many(_items(queue.name, 0, 1),
                                                        confirm_later=True)) == [None]
    # when: the connection is reset, and a new one would be taken at once
    # then: the publish that found it reset is reported at once, not sent again by kombu
    # on a channel of its own reconnection, which is not in confirm mode: there its
    # confirm would never come, and the release would wait for its lease
    _cut_short(publisher, proxy.reset, queue)
    # and: the next step reconnects and is confirmed
    again = publisher.publish_many(_items(queue.name, 51, 3), confirm_later=True)
    assert _collected(publisher, again) == [None] * 3
