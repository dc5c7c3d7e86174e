"""The states of a task key and the events that move it: the transition table both stores
follow (Cassandra and memory), and the shape of a transition (:class:`Transition`).

A key's life::

    (none) ──schedule──> pending ──release──> released ──succeed──> succeeded       (final)
                          │  ^ ^                 │ │ └──give up──> failed          (final)
                          │  │ └──retry later────┘ └──block──> failed, row kept
                          │  └──retry (operator)── failed
                          ├──cancel──> cancelled                                     (final)
                          ├──reschedule──> rescheduled (never released; another key of its
                          │                             ordering id, at the new time, is put)   (final)
                          └──expire──> expired   (not released by its deadline; also
                                                  from released, once its lease ended) (final)

The table :data:`TRANSITIONS` names each (state, event) that may happen and the state it
leads to; anything else is refused. The functions of :mod:`~celery_scheduler.store.lifecycle`
turn an event into a :class:`Transition`: the state it leads to, what becomes of the key's schedule row
(:class:`RowWrite`) and which fields of its status are written, with the values. They are
pure: a store reads what they need (the key's status, its row), calls one, and writes the
result (the memory store into its dictionaries, the Cassandra store as the statements
:func:`celery_scheduler.store.cql.transition_statements` builds), so the two stores cannot
drift apart.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import NamedTuple

from celery_scheduler.keys import TaskKey
from celery_scheduler.store.records import State, StoredTask

__all__ = ["FINAL", "TRANSITIONS", "Event", "Expiry", "Pairs", "RowKind", "RowWrite", "Transition",
           "next_state", "row_update", "transition_of"]


class Event(enum.Enum):
    """What can happen to a task key."""

    SCHEDULE = "schedule"  # a schedule record read from the task log
    CANCEL = "cancel"  # a cancel record read from the task log
    RETRY = "retry"  # an operator's retry of a failed key
    RELEASE = "release"  # the dispatcher hands the key to the workers (again, if its lease ran out)
    RETRY_LATER = "retry later"  # an attempt failed and attempts are left: pending after a backoff
    SUCCEED = "succeed"  # the dispatcher settles the key's success
    GIVE_UP = "give up"  # its last attempt failed: failed, its row gone, its task kept for a retry
    BLOCK = "block"  # its last attempt failed, its ordering id waits: failed, its row kept
    REPORT_SUCCESS = "report success"  # a worker's report of an attempt, read by the dispatcher later
    REPORT_FAILURE = "report failure"
    SETTLE = "settle"  # a row found without its task (a write that landed after the row went)
    EXPIRE = "expire"  # not released by its deadline (expires=): skipped, its row gone
    RESCHEDULE = "reschedule"  # a reschedule record: moved to another time, as another key


P, R, S, F, C = State.PENDING, State.RELEASED, State.SUCCEEDED, State.FAILED, State.CANCELLED
X, M = State.EXPIRED, State.RESCHEDULED

# (state before, event) -> state after. None before: a key the store never saw.
TRANSITIONS: Mapping[tuple[State | None, Event], State] = {
    (None, Event.SCHEDULE): P,
    (P, Event.SCHEDULE): P,  # rewritten in place, while it never ran (see scheduled)
    (P, Event.CANCEL): C,
    (P, Event.RESCHEDULE): M,  # only while it was never released (see reschedule_problem)
    (F, Event.CANCEL): C,  # only while blocked: its row is kept
    (F, Event.RETRY): P,
    (P, Event.RELEASE): R,
    (R, Event.RELEASE): R,  # released again: its start lease or its run lease ran out
    (R, Event.RETRY_LATER): P,
    (P, Event.RETRY_LATER): P,  # a release that was never sent (refused by the broker)
    (R, Event.SUCCEED): S,
    (S, Event.SUCCEED): S,  # the worker's report said so first (REPORT_SUCCESS)
    (R, Event.GIVE_UP): F,
    (P, Event.GIVE_UP): F,  # its last release was never sent
    (R, Event.BLOCK): F,
    (P, Event.BLOCK): F,
    (R, Event.REPORT_SUCCESS): S,
    (R, Event.REPORT_FAILURE): R,  # the dispatcher decides what follows (retry later, give up)
    (P, Event.SETTLE): C,  # the row went with a cancel, a release marking landed after it
    (R, Event.SETTLE): C,  # ... or with a completion: succeeded if a worker reported so
    (P, Event.EXPIRE): X,
    (R, Event.EXPIRE): X,  # its release was never heard of, and its deadline has passed
}
FINAL = frozenset({S, C, X, M})  # nothing leaves these (failed leaves only by an operator's retry)


def next_state(state: State | None, event: Event) -> State | None:
    """The state *event* leads a key in *state* to, or None if it may not happen."""
    return TRANSITIONS.get((state, event))


class RowKind(enum.Enum):
    INSERT = "insert"  # a new row (``task``), replacing the key's row elsewhere (``moved_from``)
    UPDATE = "update"  # some of the row's dispatch fields (``fields``)
    DELETE = "delete"  # the row goes


class RowWrite(NamedTuple):
    """What a transition does to the key's row in the schedule at (partition, bucket).

    ``names`` are :class:`StoredTask` fields (``attempts``, ``not_before_ms``,
    ``lease_until_ms``, ``blocked``) an update sets, ``values`` their new values; 0 times
    are "none". (Names and values apart: each kind of transition has constant names, so
    the stores look up what to write by them once.)
    """

    kind: RowKind
    partition: int
    bucket: int
    names: tuple[str, ...] = ()
    values: tuple[object, ...] = ()
    task: StoredTask | None = None
    data: bytes | None = None  # the task's bytes as read from the task log (INSERT)
    moved_from: tuple[int, int] | None = None  # (partition, bucket) of the row it replaces

    @property
    def fields(self) -> dict[str, object]:
        return dict(zip(self.names, self.values, strict=True))


class Expiry(enum.Enum):
    """How long the fields a transition writes to a status last."""

    KEEP = "keep"  # as the status's other fields: a step along the way
    FINAL = "final"  # the store's status TTL, the whole status written again to expire together
    NEVER = "never"  # for good, the whole status written again (pending, or blocked)
    REPORT = "report"  # the status TTL, for these fields only (a worker's report)


class Transition(NamedTuple):
    """One event applied to one key: its new state, its row and its status fields.

    ``status_names`` are :class:`TaskStatus` fields, and ``envelope``: the task kept with a
    failed key's status for an operator's retry (None: none kept any more);
    ``status_values`` their new values.
    """

    key: TaskKey
    event: Event
    state: State | None  # None: its status is not written (a remnant of another key's row)
    row: RowWrite | None
    status_names: tuple[str, ...]
    status_values: tuple[object, ...]
    expiry: Expiry

    @property
    def status(self) -> dict[str, object]:
        return dict(zip(self.status_names, self.status_values, strict=True))


Pairs = tuple[tuple[str, object], ...]


def transition_of(key: TaskKey, event: Event, state: State | None, row: RowWrite | None,
                status: Pairs, expiry: Expiry) -> Transition:
    """A transition from (name, value) pairs: for the transitions that are not on a hot path."""
    names, values = (tuple(zip(*status, strict=True)) or ((), ())) if status else ((), ())
    return Transition(key, event, state, row, names, values, expiry)


def row_update(partition: int, bucket: int, fields: Pairs, task: StoredTask | None = None) -> RowWrite:
    names, values = zip(*fields, strict=True)
    return RowWrite(RowKind.UPDATE, partition, bucket, names, values, task)
