"""Topics and keyspaces for the tests' schedulers, made one test ahead and dropped behind.

Making one (``scheduler init``: three Kafka topics, a Cassandra keyspace and its tables)
takes about 1.8 s and dropping one about 1 s, nearly all of it waiting on Kafka's and
Cassandra's schema changes. Done on a thread of their own while the test before (or after)
runs, they cost the suite that much less per test; one thread, so that the services see one
schema change at a time, as they did when each test made its own.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from tests.services import REPO, drop_scheduler

__all__ = ["Namespaces", "fresh_name", "schedulers"]


def fresh_name() -> str:
    """A name no other test run uses."""
    return f"t_{uuid.uuid4().hex[:12]}"


def init(app: str, kafka: str) -> Callable[[str], str]:
    """``celery -A app scheduler init`` on topic and keyspace *name*; raises with its output
    when it fails."""

    def made(name: str) -> str:
        env = {**os.environ, "CELERY_SCHEDULER_TEST_TOPIC": name, "CELERY_SCHEDULER_TEST_KEYSPACE": name,
               "CELERY_SCHEDULER_TEST_KAFKA": kafka}
        result = subprocess.run([sys.executable, "-m", "celery", "-A", app, "scheduler", "init"],
                                cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise AssertionError(f"scheduler init of {name} failed:\n{result.stdout}{result.stderr}")
        return name

    return made


class Namespaces:
    """The name :meth:`take` gives a test has its topics and keyspace made already (the
    next is made meanwhile, on a thread of its own); :meth:`drop` deletes them after, on the
    same thread. *make* makes them for a fresh name, *drop* deletes them."""

    def __init__(self, make: Callable[[str], str], drop: Callable[[str], None]) -> None:
        self._make, self._drop = make, drop
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="namespaces")
        self._next: Future[str] | None = None
        self._dropped: list[Future[None]] = []

    def take(self) -> str:
        taken = self._next or self._thread.submit(self._make, fresh_name())
        self._next = self._thread.submit(self._make, fresh_name())
        return taken.result()

    def drop(self, name: str) -> None:
        self._dropped.append(self._thread.submit(self._drop, name))

    def close(self) -> None:
        """Drop the one made ahead, and wait for every drop (their errors are raised)."""
        if self._next is not None:
            with contextlib.suppress(Exception):  # never made: nothing to drop
                self.drop(self._next.result())
        self._thread.shutdown(wait=True)
        for dropped in self._dropped:
            dropped.result()


def schedulers(app: str, kafka: str) -> Namespaces:
    """Topics and keyspaces made by *app*'s ``scheduler init``."""
    return Namespaces(init(app, kafka), lambda name: drop_scheduler(name, name))
