"""kombu's Redis channels share one client for commands that take a pooled connection."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from celery import signals
from kombu.transport import redis as transport

from celery_scheduler import redis_clients
from celery_scheduler.worker import install_worker_hooks


def _channel() -> Any:
    """A kombu Redis channel with its pools set, made without connecting (no server needed)."""
    channel = object.__new__(transport.Channel)
    channel._pool = redis.ConnectionPool()
    channel._async_pool = redis.ConnectionPool()
    channel.Client = redis.Redis
    return channel


@pytest.fixture(autouse=True)
def kombus_own(monkeypatch: pytest.MonkeyPatch) -> None:
    # install() patches kombu's class for the whole process (as in a worker; an in-process
    # worker of another test may have done it): each test starts from kombu's own method,
    # which is put back after it
    method = transport.Channel._create_client
    monkeypatch.setattr(transport.Channel, "_create_client", getattr(method, "__wrapped__", method))


def test_kombu_makes_a_client_for_each_command() -> None:
    channel = _channel()
    assert channel._create_client() is not channel._create_client()


def test_install_shares_one_client_per_channel_on_its_pool() -> None:
    assert redis_clients.install()
    assert redis_clients.install()  # a second call leaves the first in place
    first, second = _channel(), _channel()
    client = first._create_client()
    assert first._create_client() is client
    assert client.connection_pool is first._pool
    assert second._create_client() is not client
    with first.conn_or_acquire() as acquired:
        assert acquired is client
    with first.conn_or_acquire(client=second._create_client()) as given:
        assert given is second._create_client()  # a client passed in is used as before


def test_a_new_pool_gets_a_new_client() -> None:
    redis_clients.install()
    channel = _channel()
    old = channel._create_client()
    channel._pool = redis.ConnectionPool()  # as kombu does after a lost connection
    new = channel._create_client()
    assert new is not old
    assert new.connection_pool is channel._pool
    assert channel._create_client() is new


def test_asynchronous_clients_are_still_made_each_time() -> None:
    # kombu gives its BRPOP client a connection of its own: shared, every command would use it
    redis_clients.install()
    channel = _channel()
    client = channel._create_client(asynchronous=True)
    assert client.connection_pool is channel._async_pool
    assert channel._create_client(asynchronous=True) is not client
    assert channel._create_client() is not client


def test_reuse_clients_shares_one_channel_only() -> None:
    channel, other = _channel(), _channel()
    assert redis_clients.reuse_clients(channel)
    assert redis_clients.reuse_clients(channel)  # already: left as it is
    client = channel._create_client()
    assert channel._create_client() is client
    assert channel._create_client(asynchronous=True) is not channel._create_client(asynchronous=True)
    assert other._create_client() is not other._create_client()
    channel._pool = redis.ConnectionPool()
    assert channel._create_client() is not client


def test_reuse_clients_leaves_other_transports_alone() -> None:
    class AmqpChannel:
        pass

    channel = AmqpChannel()
    assert not redis_clients.reuse_clients(channel)
    assert not hasattr(channel, "_create_client")


def test_a_pipeline_of_the_shared_client_is_new_each_time() -> None:
    channel = _channel()
    redis_clients.reuse_clients(channel)
    client = channel._create_client()
    first, second = client.pipeline(), client.pipeline()
    assert first is not second
    first.set("a", 1)
    assert len(second.command_stack) == 0  # commands queued on one do not show on the other


def test_a_worker_with_the_hooks_shares_them_from_its_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport.Channel, "_connparams", transport.Channel._connparams)  # redis_worker_fix
    install_worker_hooks()
    channel = _channel()
    assert channel._create_client() is not channel._create_client()
    signals.worker_init.send(sender=None)
    assert channel._create_client() is channel._create_client()
