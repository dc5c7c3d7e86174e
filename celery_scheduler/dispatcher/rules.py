"""What the release engine decides, as pure functions: from what it knows of a task and the
time, to a decision it then carries out (store writes, the timetable, logs).

The engine (:mod:`celery_scheduler.dispatcher.engine`) is the loop that gathers the facts
(statuses read from the store, beats and outcomes read from Kafka, its leases) and applies
the decisions; nothing here reads a clock, a random source or the store, so each rule is
unit-tested on its own (``tests/unit/test_rules.py``).
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass

from celery_scheduler.envelope import RetryPolicy
from celery_scheduler.store.base import State, TaskStatus

__all__ = ["AfterFailure", "Exhausted", "LeaseEnd", "RetryAt", "after_failure", "ended_elsewhere",
           "stored_outcome", "success_deadline", "when_lease_ended"]


# --- a failed attempt -----------------------------------------------------------------------

@dataclass(frozen=True)
class RetryAt:
    """Try again: pending from *not_before_ms* (jittered exponential backoff)."""

    not_before_ms: int
    delay_ms: int


class Exhausted(enum.Enum):
    """No attempt is left: the key fails, and its row goes (GIVE_UP) or stays to hold its
    ordering id back until an operator acts (BLOCK, ``scheduler_on_exhausted = "block"``)."""

    GIVE_UP = "give up"
    BLOCK = "block"


AfterFailure = RetryAt | Exhausted


def after_failure(attempts: int, policy: RetryPolicy, on_exhausted: str, now_ms: int,
                  rng: random.Random) -> AfterFailure:
    """What follows the failure of attempt *attempts* of a task retried by *policy*.

    The backoff doubles from ``policy.backoff`` up to ``policy.backoff_max`` seconds, and
    each delay is drawn between half and all of it, so that tasks that failed together (a
    dependency that went down) do not all come back at once.
    """
    if attempts < policy.max_attempts:
        backoff = min(policy.backoff_max, policy.backoff * 2 ** (attempts - 1))
        delay_ms = int(backoff * rng.uniform(0.5, 1.0) * 1000)
        return RetryAt(now_ms + delay_ms, delay_ms)
    return Exhausted.BLOCK if on_exhausted == "block" else Exhausted.GIVE_UP


# --- a success ----------------------------------------------------------------------------------

def success_deadline(now_ms: int, linger_ms: int, successor_due_ms: int | None, ahead_ms: int,
                     earliest_pending_ms: int | None) -> int:
    """When a success read now must be recorded in the store at the latest.

    Successes linger to share one write (*linger_ms*), but the ordering id stays held until
    its success is recorded: not past the time its next task (due at *successor_due_ms*)
    is marked, *ahead_ms* before it is due. *earliest_pending_ms*: the deadline of the
    successes already waiting, if any; they are written together, at the earlier of both.
    """
    by = now_ms + linger_ms
    if successor_due_ms is not None:
        by = min(by, successor_due_ms - ahead_ms)
    return by if earliest_pending_ms is None else min(by, earliest_pending_ms)


# --- a release whose outcome has not come ---------------------------------------------------------

def stored_outcome(status: TaskStatus | None, attempt: int, lease_until_ms: int
                   ) -> tuple[bool, str | None] | None:
    """(succeeded, error) of the outcome a worker stored for release *attempt* of a task
    (the one leased until *lease_until_ms*), or None if the store has none of that release.

    A worker of an earlier version stores no generation (0): taken as this release's.
    """
    if (status is None or not status.outcome or status.outcome_attempt != attempt
            or status.outcome_generation not in (0, lease_until_ms)):
        return None
    return status.outcome == "succeeded", status.last_error


class LeaseEnd(enum.Enum):
    """What the end of a release's lease without an outcome means."""

    RUNNING = "running"  # not ended yet (heard running since), or outcomes not all read
    NOT_STARTED = "not started"  # never heard running: send it again, the same attempt
    WORKER_LOST = "worker lost"  # heard running, silent since: a failed attempt


def when_lease_ended(now_ms: int, release_end_ms: int, heard: bool, outcomes_read: bool) -> LeaseEnd:
    """What became of a release, its lease certainly over at *release_end_ms* unless it was
    *heard* running since, with no outcome of it stored; *outcomes_read*: every outcome and
    beat reported before that end has been read (else one may be in the topic, unread)."""
    if now_ms < release_end_ms or not outcomes_read:
        return LeaseEnd.RUNNING
    return LeaseEnd.WORKER_LOST if heard else LeaseEnd.NOT_STARTED


def ended_elsewhere(status: TaskStatus | None) -> bool:
    """Whether a task's status says it will not run here: finished, or cancelled."""
    return status is not None and (status.state.finished or status.state is State.CANCELLED)
