"""Reading the partitions a dispatcher keeps while its Kafka group forms again.

A broker restart ends every dispatcher's group session, and the group forms again only once
the old members' sessions have run out on the broker too: about ``session.timeout.ms``
(6 s) after the broker is back, every time. Meanwhile a dispatcher keeps releasing from the
partitions it holds the lease of (see :mod:`celery_scheduler.dispatcher.membership`), but
its group consumer has nothing assigned: what applications scheduled around the restart
was read only once the group had formed, and tasks due within those seconds started as
late (the long chaos run's tail of lateness after Kafka restarts).

So while partitions are kept, :class:`KeptReader` reads them with a consumer of its own,
assigned by hand (no group session to wait for) from where the group's ingest stopped, and
the dispatcher's ingest loop writes what it reads as it writes assigned partitions: only
while this process holds the partition's lease. It commits nothing: once the group has
formed, the member that gets a partition reads it from the committed offset, and writes
again what was written meanwhile (writes are idempotent, as after any batch that failed).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Protocol

from celery_scheduler.dispatcher.ingest import Ingest
from celery_scheduler.tasklog.base import TaskLogReader

__all__ = ["HandReader", "KeptReader"]

logger = logging.getLogger(__name__)


class HandReader(TaskLogReader, Protocol):
    """A reader of the group's whose partitions are assigned by hand, committing nothing
    (:class:`~celery_scheduler.tasklog.reader.HandAssignedReader` for Kafka)."""

    def assign(self, offsets: Mapping[int, int | None]) -> None: ...

    def unassign(self, partitions: Collection[int]) -> None: ...

    def close_aside(self, what: str) -> None: ...


class KeptReader:
    """Follows the set of kept partitions with a hand-assigned reader (made on demand).

    *make_reader* makes a reader of the dispatchers' group that never joins it;
    *make_ingest* the ingest loop that writes what a reader reads (the dispatcher's own,
    but with that reader). Every call comes from the dispatcher's main thread.
    """

    def __init__(self, make_reader: Callable[[], HandReader],
                 make_ingest: Callable[[TaskLogReader], Ingest]) -> None:
        self._make_reader = make_reader
        self._make_ingest = make_ingest
        self._reader: HandReader | None = None
        self._ingest: Ingest | None = None
        self._partitions: set[int] = set()

    @property
    def partitions(self) -> list[int]:
        """The partitions read now."""
        return sorted(self._partitions)

    def follow(self, kept: Iterable[int], written_to: Mapping[int, int]) -> None:
        """Read *kept* from now on (nothing: the consumer is closed); a partition new to it
        from its offset in *written_to* (the group's ingest had written all before it), or
        else from the group's committed offset."""
        wanted = set(kept)
        if wanted == self._partitions:
            return
        if not wanted:
            self.close()
            return
        if self._reader is None or self._ingest is None:
            self._reader = self._make_reader()
            self._ingest = self._make_ingest(self._reader)
        reader, ingest = self._reader, self._ingest
        gone = sorted(self._partitions - wanted)
        new = {n: written_to.get(n) for n in sorted(wanted - self._partitions)}
        if gone:
            reader.unassign(gone)
            ingest.revoked(gone)
        if new:
            # Where the group's ingest stopped, when known, rather than the committed
            # offset: asking for that needs the group's coordinator, which a broker just
            # back may not have loaded yet (in a chaos run the answer was NOT_COORDINATOR,
            # and the partitions were not read until the group formed again).
            reader.assign(new)
            ingest.assigned(new)
        logger.info("reading kept partitions %s until the group assigns them again", sorted(wanted))
        self._partitions = wanted

    def read_once(self, timeout: float) -> int:
        """Read and write one batch of the kept partitions; how many records it held."""
        if self._ingest is None:
            return 0
        return self._ingest.poll_once(timeout)

    def close(self) -> None:
        reader, self._reader, self._ingest = self._reader, None, None
        self._partitions = set()
        if reader is not None:
            reader.close_aside("the consumer of kept partitions")

