"""Log lines repeated through an outage, shown once: the first as it came, the rest counted,
and one line when they stop (see :mod:`celery_scheduler.outages`).

:class:`Repeats` is the thread-safe part both users share: it ends an outage once no failure
came for the quiet time, from a thread of its own that runs only while an outage is open.
:class:`QuietRepeats` is a logging filter for a handler: the warnings and errors other
libraries repeat while a service is away (cassandra-driver writes "Error attempting to
reconnect" and "Error preparing query" about once a second each, with tracebacks at every
connection attempt) are shown once per outage. The package's own lines pass: each of its
retry loops says an outage once itself.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from celery_scheduler.outages import Ended, Outages

__all__ = ["QuietRepeats", "Repeats"]

K = TypeVar("K", bound=Hashable)


class Repeats(Generic[K]):
    """Outages of repeated lines by key; *on_end* is told of each once it is quiet."""

    def __init__(self, on_end: Callable[[Ended[K]], None], quiet: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.on_end = on_end
        self.clock = clock
        self.outages: Outages[K] = Outages(quiet=quiet)
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None

    def failed(self, key: K) -> bool:
        """A repeatable line of *key* came: True if it is to be shown."""
        with self._lock:
            shown = self.outages.failed(key, self.clock())
            if self._watcher is None or not self._watcher.is_alive():
                self._watcher = threading.Thread(target=self._run, daemon=True,
                                                 name="celery-scheduler-repeats")
                self._watcher.start()
        return shown

    def flush(self, now: float | None = None) -> None:
        """End the outages quiet for the quiet time, telling *on_end* of each."""
        with self._lock:
            ended = self.outages.quieted(self.clock() if now is None else now)
        for outage in ended:
            self.on_end(outage)

    def _run(self) -> None:
        while True:
            time.sleep(1.0)
            self.flush()
            with self._lock:  # log() adds under the same lock: no outage is left unwatched
                if not self.outages:
                    self._watcher = None
                    return


class QuietRepeats(logging.Filter):
    """A handler's filter showing other libraries' repeated warnings once per outage."""

    def __init__(self, own: str = "celery_scheduler", quiet: float = 5.0) -> None:
        super().__init__()
        self.own = own
        self.repeats: Repeats[tuple[str, int, str]] = Repeats(self._ended, quiet)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or record.name.split(".")[0] == self.own:
            return True
        # the same message whatever its arguments: a host, a delay, an attempt number
        return self.repeats.failed((record.name, record.levelno, str(record.msg)))

    def _ended(self, outage: Ended[tuple[str, int, str]]) -> None:
        if not outage.hidden:
            return  # its one line said it all
        name, _, message = outage.key
        logging.getLogger(name).info("%d more line(s) like %r not shown; they stopped after %.1fs",
                                     outage.hidden, message[:120], outage.lasted)
