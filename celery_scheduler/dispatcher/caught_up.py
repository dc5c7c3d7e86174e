"""How far the ingest loop has read each partition, in time: what lets a cancel win.

A cancel that Kafka acknowledged before a task was due must stop it. The engine releases
from the store, the ingest loop writes cancels to it from Kafka: after a takeover (the new
owner reads the partition again from its committed offset), a store outage (the batch is
applied again) or a long linger, the engine could mark a task released while its cancel
was still in Kafka, not yet read. So the engine marks a task released only once the ingest
loop has shown that every record acknowledged before the task's earliest marking time
(its due time less ``release_ahead_seconds``) has been applied.

The ingest loop shows it so: at time *t* it asks the broker for the partition's end offset
(a record acknowledged before *t* is below it); once every record below that offset is
applied, the partition is caught up to *t*. It asks for the partitions the engine is
waiting for, and keeps asking for a while after, so that a busy partition's next tasks find
it caught up already. While an answer waits, a lingering batch counts as applied the plain
schedule calls it holds that are due after anything the engine may release meanwhile: they
cannot hold a release back (see ingest.py); any other record it holds is written at once.
A batch may carry a hot ordering id's records to the next one (carrying.py): the partition
counts as applied past them, but the tasks of that ordering id they may hold back stay
unreleased until they are written.

The engine thread calls :meth:`CaughtUp.covers`; the ingest loops (the group's, and the
one reading kept partitions) call the rest.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterable, Mapping

from celery_scheduler.keys import TaskKey

__all__ = ["CaughtUp"]

# A partition the engine waited for is asked about for this long after (ms).
KEEP_ASKING_MS = 5_000
# Asked about at most this often (ms): each ask is one round trip to the partitions' leaders.
ASK_EVERY_MS = 50
# A partition whose end could not be asked for is asked again this much later (ms): each
# failed ask may have waited for a leader that is away.
ASK_AGAIN_AFTER_FAILURE_MS = 500
# Answers kept per partition until applied (the oldest go first).
PENDING_KEPT = 8


class CaughtUp:
    """Per partition, a time before which every record acknowledged has been applied."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._until: dict[int, int] = {}  # partition -> caught up to (ms)
        self._wanted: dict[int, int] = {}  # partition -> last asked for by the engine (ms)
        # partition -> answers (asked at, end offset then), oldest first: caught up to that
        # time once applied up to that offset
        self._pending: dict[int, collections.deque[tuple[int, int]]] = {}
        self._asked: dict[int, int] = {}  # partition -> when its end was last asked for
        # partition -> ordering id -> from where records carried to a later batch hold its
        # tasks back (None: all of them; carrying.py)
        self._carrying: dict[int, dict[str, tuple[int, str] | None]] = {}

    def covers(self, partition: int, since_ms: int, now_ms: int, key: TaskKey | None = None
               ) -> bool:
        """Whether every record of *partition* acknowledged before *since_ms* is applied,
        and no record carried to a later batch holds *key* back; if not applied, the ingest
        loop is asked to find out (engine thread)."""
        with self._lock:
            if self._until.get(partition, -1) >= since_ms:
                return key is None or not self._holds(partition, key)
            self._wanted[partition] = now_ms
            return False

    def carried(self, partition: int, key: TaskKey) -> bool:
        """Whether a record carried to a later batch holds *key* back (for logs)."""
        with self._lock:
            return self._holds(partition, key)

    def _holds(self, partition: int, key: TaskKey) -> bool:
        holds = self._carrying.get(partition)
        if not holds or key.ordering_id not in holds:
            return False
        held_from = holds[key.ordering_id]
        return held_from is None or (key.scheduled_ms, key.uniqueness_key) >= held_from

    def carrying(self, partition: int, holds: Mapping[str, tuple[int, str] | None]) -> None:
        """The records of *partition* shown applied from now on hold records that a later
        batch writes (carrying.py): of each ordering id in *holds*, the tasks from that place
        on (None: all of them) stay unreleased until they are written. Called before the
        partition is shown applied past them."""
        with self._lock:
            if holds:
                self._carrying[partition] = dict(holds)
            else:
                self._carrying.pop(partition, None)

    def to_ask(self, owned: Iterable[int], now_ms: int) -> list[int]:
        """Those of *owned* whose end offset the ingest loop should ask for now."""
        with self._lock:
            return [p for p in owned
                    if now_ms - self._wanted.get(p, -KEEP_ASKING_MS) < KEEP_ASKING_MS
                    and now_ms - self._asked.get(p, -ASK_EVERY_MS) >= ASK_EVERY_MS]

    def asked(self, partition: int, at_ms: int, end_offset: int) -> None:
        """The broker said at *at_ms* (taken before asking) that *partition* ends at *end_offset*."""
        with self._lock:
            self._asked[partition] = at_ms
            answers = self._pending.setdefault(partition, collections.deque(maxlen=PENDING_KEPT))
            answers.append((at_ms, end_offset))

    def ask_failed(self, partition: int, at_ms: int) -> None:
        """Asking where *partition* ends failed at *at_ms*: ask again a little later."""
        with self._lock:
            self._asked[partition] = at_ms + ASK_AGAIN_AFTER_FAILURE_MS - ASK_EVERY_MS

    def waiting(self) -> bool:
        """Whether the engine waits for a partition whose end has been asked for."""
        with self._lock:
            return bool(self._pending)

    def applied(self, partition: int, offset: int) -> None:
        """Every record of *partition* below *offset* is applied, or its cancel held back, or
        it can hold back no release the engine may make before the answer's time."""
        with self._lock:
            answers = self._pending.get(partition)
            while answers and offset >= answers[0][1]:
                at_ms, _ = answers.popleft()
                self._until[partition] = max(self._until.get(partition, -1), at_ms)
            if answers is not None and not answers:
                del self._pending[partition]

    def forget(self, partitions: Iterable[int]) -> None:
        """*partitions* were given up or assigned afresh: what was shown of them no longer holds."""
        with self._lock:
            for partition in partitions:
                self._until.pop(partition, None)
                self._pending.pop(partition, None)
                self._asked.pop(partition, None)
                self._carrying.pop(partition, None)

    def until(self, partition: int) -> int | None:
        """The time *partition* is caught up to, if any (for logs and tests)."""
        with self._lock:
            return self._until.get(partition)
