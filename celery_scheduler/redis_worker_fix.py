"""Keep a Celery worker on Redis alive when the broker goes away while it holds messages.

With Celery 5.7 and kombu 5.7, a worker that holds unacknowledged messages (eta tasks it
waits to run, prefetched ones) exits with "Unrecoverable error: AttributeError('NoneType'
object has no attribute 'hostname')" when its Redis connection is lost:

1. the consumer's cleanup first *collects* the connection: each channel tries to put its
   unacknowledged messages back, which fails while Redis is down, so the channel stays open,
   and the collect then drops the connection's settings (``transport.client = None``);
2. it then *closes* the connection, which closes that channel again: the second try at
   putting the messages back needs a new Redis client, built from the settings the collect
   dropped, and the AttributeError it raises is not one of the connection errors the close
   ignores, so it ends the worker.

:func:`install` makes step 2 fail as the first try did, with Redis' own ``ConnectionError``:
the close ignores it, and the consumer reconnects as it does after any lost connection. The
messages stay in Redis' unacknowledged set, from where kombu gives them to a worker again
after the visibility timeout (and the dispatcher releases a key again when its lease ends):
nothing is lost. Only a channel whose connection has no settings left changes behaviour.

It is installed in worker processes (Celery's ``worker_init`` signal), never in producers.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["install"]

_lock = threading.Lock()
_MARK = "_celery_scheduler_fixed"


def install(**_: Any) -> bool:
    """Patch kombu's Redis channel once per process; False when kombu's Redis transport is absent.

    Takes (and ignores) a signal's arguments, so it can be connected to ``worker_init``.
    """
    try:
        import redis.exceptions
        from kombu.transport import redis as transport
    except ImportError:  # no redis client: the worker cannot be on Redis
        return False
    with _lock:
        original: Callable[..., Any] = transport.Channel._connparams  # type: ignore[attr-defined]
        if getattr(original, _MARK, False):
            return True

        @functools.wraps(original)
        def connparams(self: Any, *args: Any, **kwargs: Any) -> Any:
            if self.connection.client is None:
                raise redis.exceptions.ConnectionError(
                    "the broker connection was already closed after a lost connection; the "
                    "worker reconnects and the unacknowledged messages stay in Redis")
            return original(self, *args, **kwargs)

        setattr(connparams, _MARK, True)
        transport.Channel._connparams = connparams  # type: ignore[attr-defined]
    return True
