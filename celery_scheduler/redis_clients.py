"""One Redis client per kombu Redis channel, instead of a new one for each command.

kombu's Redis channel makes a ``redis.Redis`` each time it sends commands outside its
consumer's own connection: for every publish and publish batch of a producer, and for every
acknowledgement of a worker (``QoS.ack`` takes a pipeline from a fresh client). A Redis
client copies its table of about 170 reply callbacks when it is made. In a backlog drain
that was a fifth of a solo worker's Python time, and in the dispatcher a quarter of a
release's CPU (py-spy). Such a client holds no connection of its own: each command or
pipeline takes one from the channel's pool and gives it back, so one client serves them
all, from any thread.

Only those clients are shared. The channel's asynchronous client (BRPOP, pub/sub) is given
a connection of its own (``client.connection``), through which every command of that client
would then go: kombu makes it as before. When kombu replaces the channel's pool (after a
lost connection), the next command gets a new client on the new pool.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["install", "reuse_clients"]

_lock = threading.Lock()
_MARK = "_celery_scheduler_shared_client"
_CLIENT = "_celery_scheduler_client"  # the shared client, in the channel's __dict__


def _shared(channel: Any, make: Callable[..., Any]) -> Any:
    """*channel*'s shared client on its current pool, made by *make* when there is none."""
    pool = channel.pool
    client = channel.__dict__.get(_CLIENT)
    if client is None or client.connection_pool is not pool:
        client = channel.__dict__[_CLIENT] = make(asynchronous=False)
    return client


def reuse_clients(channel: Any) -> bool:
    """Make *channel* (kombu's Redis channel) send its commands through one client.

    False, leaving it alone, for a channel of another transport, or a kombu whose Redis
    channel makes its clients another way.
    """
    make = getattr(channel, "_create_client", None)
    if make is None or not hasattr(channel, "conn_or_acquire"):
        return False
    if getattr(make, _MARK, False):
        return True

    def create(asynchronous: bool = False) -> Any:
        return make(asynchronous=True) if asynchronous else _shared(channel, make)

    setattr(create, _MARK, True)
    channel._create_client = create
    return True


def install(**_: Any) -> bool:
    """Make every kombu Redis channel of this process share its clients; False without kombu's
    Redis transport.

    Takes (and ignores) a signal's arguments: a worker connects it to ``worker_init``, so its
    consumer's channel (and any producer's) share theirs from the start. Prefork's children
    inherit it.
    """
    try:
        from kombu.transport import redis as transport
    except ImportError:  # no redis client: nothing of this process is on Redis
        return False
    with _lock:
        original: Callable[..., Any] = transport.Channel._create_client  # type: ignore[attr-defined]
        if getattr(original, _MARK, False):
            return True

        @functools.wraps(original)
        def create(self: Any, asynchronous: bool = False) -> Any:
            if asynchronous:
                return original(self, asynchronous=True)
            return _shared(self, functools.partial(original, self))

        setattr(create, _MARK, True)
        transport.Channel._create_client = create  # type: ignore[attr-defined]
    return True
