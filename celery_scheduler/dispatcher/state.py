"""What the release engine holds and hears: its settings, each owned partition's loader and
lease, and the events the other threads of a dispatcher send it (typed, one class each)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from celery_scheduler.dispatcher.loader import PartitionLoader
from celery_scheduler.dispatcher.timetable import Loaded
from celery_scheduler.keys import TaskKey
from celery_scheduler.release.confirms import Unconfirmed
from celery_scheduler.store.base import Lease, StoredTask
from celery_scheduler.wire import OutcomeBatch, Release

__all__ = ["Assigned", "Cancelled", "EngineSettings", "Event", "Partition", "Persisted", "PrepareMany",
           "PublishMany", "PublishPrepared", "Revocation", "Sending", "Sent"]


@dataclass(frozen=True)
class EngineSettings:
    # a released task's start lease, from its due time (or release, if later), and its run
    # lease, renewed by its worker's beats (see celery_scheduler.heartbeat)
    start_lease_seconds: float = 8.0
    lease_seconds: float = 20.0
    partition_lease_seconds: float = 6.0  # a partition's ownership lease
    on_exhausted: str = "skip"
    max_loaded: int = 5000  # per partition
    lookahead_seconds: float = 60.0
    page_size: int = 500
    outcome_poll_seconds: float = 2.0  # how often the store is asked about in-flight tasks
    release_batch: int = 500  # most tasks released per step, so leases are renewed in between
    max_in_flight: int = 0  # tasks released and not finished at once; 0: follow the outcome rate
    tick_seconds: float = 0.05  # longest sleep between checks
    # The ingest loop of this process not back for this long: it hangs (a Kafka client call
    # that never returns), so its partitions' new tasks go unread; give their leases up.
    ingest_stall_seconds: float = 60.0
    # Mark a task released up to this long before it is due, and send it at its due time
    # from a thread of its own (see ``ontime``); 0 marks and sends it in one go once due.
    release_ahead_seconds: float = 0.0
    # Store successes up to this long after they are read, so that those of neighbouring
    # steps share a request; never later than the next task of their ordering id needs
    # (it is marked once its predecessor's success is stored). 0 stores them every step.
    finish_linger_seconds: float = 0.0


@dataclass
class Partition:
    """An owned partition: its loader, and its lease once taken."""

    loader: PartitionLoader
    lease: Lease | None = None
    lease_mono: float = 0.0  # monotonic time the lease request was sent
    next_attempt_mono: float = 0.0


@dataclass(frozen=True)
class Assigned:
    """Kafka gave this dispatcher *partitions*: take their leases and load them."""

    partitions: tuple[int, ...]


@dataclass
class Revocation:
    """Stop releasing from *partitions* and give their leases up; *done* once that is so."""

    partitions: list[int]
    done: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class Persisted:
    """The ingest loop stored *row* (a new task, or a new version of a pending one)."""

    row: StoredTask


@dataclass(frozen=True)
class Cancelled:
    """The ingest loop applied cancels (or moves) of *keys* (whether or not they removed
    anything)."""

    keys: tuple[TaskKey, ...]


# Publishes releases in order; for each, None (sent), ReleaseNotSentError (certainly not
# sent: released again soon) or another error (it may have been sent: it stays released).
PublishMany = Callable[[list[tuple[Loaded, Release]]], list[Exception | None]]
# Builds releases' messages ahead of their due time: for each, what PublishPrepared takes in
# its place (None: built when it is sent).
PrepareMany = Callable[[list[tuple[Loaded, Release]]], list[Any]]
# PublishMany, given what PrepareMany built for each release (or None). A release whose
# broker confirms it later (RabbitMQ) is Unconfirmed until the sender's confirm call settles it.
PublishPrepared = Callable[[list[tuple[Loaded, Release]], list[Any]], list[Exception | Unconfirmed | None]]


@dataclass(frozen=True)
class Sending:
    """A release marked in the store, to be sent to the broker at *due_ms*, or as soon as
    it is marked if *early* (its message carries its due time, and the broker's consumer
    holds it until then: Celery's ``eta``)."""

    task: Loaded
    release: Release
    due_ms: int
    early: bool = False

    @property
    def send_ms(self) -> int:
        return 0 if self.early else self.due_ms


@dataclass(frozen=True)
class Sent:
    """What became of releases handed to the on-time sender, each sent (or not) at *sent_ms*.

    Per release: None (sent), ReleaseNotSentError (certainly not sent) or another error
    (it may have been sent).
    """

    results: list[tuple[Sending, Exception | None]]
    sent_ms: int


# Workers' outcomes arrive as the OutcomeBatch the outcome reader made.
Event = Assigned | Revocation | Persisted | Cancelled | OutcomeBatch | Sent
