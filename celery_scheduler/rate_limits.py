"""Cluster-wide rate limits: at most N releases a second of a task name, across every
dispatcher, or of one ordering id.

::

    from celery_scheduler import rate_limits

    rate_limits.limit(app, task="proj.tasks.send_reminder", per_second=50)
    rate_limits.limit(app, ordering_id="customer-42", per_second=0.2)   # one every 5 s
    rate_limits.lift(app, task="proj.tasks.send_reminder")
    rate_limits.in_force(app)

Celery's own ``rate_limit`` is per worker: ten workers at ``50/s`` run 500 a second. These
limit the releases instead, which the dispatchers make. A limit is kept in Cassandra, and
every dispatcher reads the limits every two seconds (with the pauses). A task name's limit
is shared among the dispatchers by the partitions each holds: each releases its share, so
the group keeps to the limit when the name's tasks are spread over many ordering ids (a
task name used by a handful of ordering ids may get less). An ordering id's limit spaces
its releases: one every 1/N seconds at most. A release waits for its slot, in its ordering
id's order as ever; nothing is dropped, and a limit lifted lets what waits go at once. A
limit applies to what a resume lets go, too.
"""

from __future__ import annotations

import math
from typing import Any

from celery_scheduler.audit import note, operator
from celery_scheduler.client import get_client
from celery_scheduler.errors import RateLimitError
from celery_scheduler.keys import from_epoch_ms
from celery_scheduler.store.records import PauseScope, RateLimit

__all__ = ["MAX_PER_SECOND", "as_json", "in_force", "lift", "limit"]

MAX_PER_SECOND = 100_000.0


def _scope(task: str | None, ordering_id: str | None) -> tuple[PauseScope, str]:
    """The one thing a limit or lift names: a task name or an ordering id."""
    named = [(scope, value) for scope, value in ((PauseScope.TASK, task),
                                                 (PauseScope.ORDERING_ID, ordering_id))
             if value is not None]
    if len(named) != 1:
        given = ", ".join(scope.value for scope, _ in named) or "none"
        raise RateLimitError(f"name exactly one of task and ordering_id, got {given}")
    scope, value = named[0]
    if not isinstance(value, str) or not value.strip():
        raise RateLimitError(f"the {scope.value} to rate-limit must be a non-empty string, "
                             f"got {value!r}")
    return scope, value


def limit(app: Any, *, per_second: float, task: str | None = None, ordering_id: str | None = None,
          by: str | None = None) -> RateLimit:
    """Release task *task* (across every dispatcher), or ordering id *ordering_id*, at most
    *per_second* times a second, until :func:`lift`; a new limit replaces the one before.
    *by* defaults to this process's user and host (the operators' log keeps it)."""
    scope, value = _scope(task, ordering_id)
    if isinstance(per_second, bool) or not isinstance(per_second, (int, float)) or not (
            math.isfinite(per_second) and 0 < per_second <= MAX_PER_SECOND):
        raise RateLimitError(f"per_second must be a number above 0 and at most {MAX_PER_SECOND:g}, "
                             f"got {per_second!r}; to stop releases altogether, pause instead")
    client = get_client(app)
    kept = RateLimit(scope, value, float(per_second), client.clock(),
                     by if by is not None else operator())
    client.store.put_rate_limit(kept)
    note(client, "rate-limit", kept.label, f"{kept.per_second:g}/s", kept.by)
    return kept


def lift(app: Any, *, task: str | None = None, ordering_id: str | None = None,
         by: str | None = None) -> RateLimit:
    """Lift the rate limit of *task* or *ordering_id*; return it. :class:`RateLimitError` if
    there is none (the limits in force are named in its message)."""
    scope, value = _scope(task, ordering_id)
    client = get_client(app)
    kept = {(r.scope, r.value): r for r in client.store.rate_limits()}
    lifted = kept.get((scope, value))
    if lifted is None:
        named = ", ".join(r.label for r in kept.values()) or "nothing"
        raise RateLimitError(f"{scope.value} {value!r} has no rate limit (limited: {named})")
    client.store.drop_rate_limit(scope, value)
    note(client, "rate-limit lift", lifted.label, by=by)
    return lifted


def in_force(app: Any) -> list[RateLimit]:
    """Every rate limit in force, oldest first."""
    return sorted(get_client(app).store.rate_limits(), key=lambda r: (r.set_ms, r.scope.value, r.value))


def as_json(limit: RateLimit) -> dict[str, Any]:
    """*limit* as the CLI's ``--json`` and the HTTP API show it."""
    return {"scope": limit.scope.value, "value": limit.value, "per_second": limit.per_second,
            "set_at": from_epoch_ms(limit.set_ms).isoformat(), "by": limit.by}
