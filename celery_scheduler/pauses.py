"""Pause and resume releases: of one task name, one ordering id, or everything.

::

    from celery_scheduler import pauses

    pauses.pause(app, ordering_id="customer-42", reason="incident 1234")
    pauses.pause(app, task="proj.tasks.send_reminder")
    pauses.pause(app, everything=True)
    pauses.resume(app, ordering_id="customer-42")
    pauses.in_force(app)            # every pause, oldest first

A pause is kept in Cassandra, so it outlives any dispatcher: a dispatcher that starts holds
everything until it has read the pauses once. Every dispatcher reads them every two seconds
(:data:`celery_scheduler.dispatcher.pausing.READ_EVERY_MS`), so a pause takes effect within that
(and a release already marked ahead of its due time, ``scheduler_release_ahead_seconds``,
still goes). Nothing held is lost: a held task keeps its place, and on resume what fell due
meanwhile is released in schedule order, one at a time per ordering id as ever.

What a pause holds is the head of an ordering id: the earliest task waiting in it. A pause
of a task name therefore also holds the tasks after a held one in its ordering id, whatever
their names (their order is kept); tasks already released run on. Periodic occurrences are
tasks like any other: a pause of their task name holds them (see ``periodic_admin`` to stop
an entry from firing at all).
"""

from __future__ import annotations

from typing import Any

from celery_scheduler.audit import note, operator
from celery_scheduler.client import get_client
from celery_scheduler.errors import PauseError
from celery_scheduler.keys import from_epoch_ms
from celery_scheduler.store.records import Pause, PauseScope

__all__ = ["as_json", "in_force", "pause", "resume", "scope_of"]

def scope_of(task: str | None = None, ordering_id: str | None = None,
             everything: bool = False) -> tuple[PauseScope, str]:
    """The one thing a pause or resume names; :class:`PauseError` if it names none or two."""
    named = [(scope, value) for scope, value in ((PauseScope.TASK, task),
                                                 (PauseScope.ORDERING_ID, ordering_id))
             if value is not None]
    if everything:
        named.append((PauseScope.ALL, ""))
    if len(named) != 1:
        given = ", ".join(scope.value for scope, _ in named) or "none"
        raise PauseError(f"name exactly one of task, ordering_id and everything, got {given}")
    scope, value = named[0]
    if scope is not PauseScope.ALL and (not isinstance(value, str) or not value.strip()):
        raise PauseError(f"the {scope.value} to pause or resume must be a non-empty string, "
                         f"got {value!r}")
    return scope, value


def pause(app: Any, *, task: str | None = None, ordering_id: str | None = None,
          everything: bool = False, reason: str = "", by: str | None = None) -> Pause:
    """Hold back the releases of task *task*, of ordering id *ordering_id*, or of everything,
    until :func:`resume`. Pausing what is paused already keeps the first pause's time. *by*
    (who pauses) defaults to this process's user and host; the operators' log keeps it
    (:mod:`celery_scheduler.audit`)."""
    scope, value = scope_of(task, ordering_id, everything)
    client = get_client(app)
    kept = {(p.scope, p.value): p for p in client.store.pauses()}
    earlier = kept.get((scope, value))
    held = Pause(scope, value, earlier.paused_ms if earlier else client.clock(),
                 by if by is not None else operator(), reason)
    client.store.put_pause(held)
    note(client, "pause", held.label, reason, held.by)
    return held


def resume(app: Any, *, task: str | None = None, ordering_id: str | None = None,
           everything: bool = False, by: str | None = None) -> Pause:
    """Lift the pause of *task*, *ordering_id* or everything; return it. :class:`PauseError`
    if there is none (the pauses in force are named in its message). What else is paused
    stays paused: resuming everything lifts only the pause of everything."""
    scope, value = scope_of(task, ordering_id, everything)
    client = get_client(app)
    kept = {(p.scope, p.value): p for p in client.store.pauses()}
    lifted = kept.get((scope, value))
    if lifted is None:
        named = ", ".join(p.label for p in kept.values()) or "nothing"
        what = "everything is" if scope is PauseScope.ALL else f"{scope.value} {value!r} is"
        raise PauseError(f"{what} not paused (paused: {named})")
    client.store.drop_pause(scope, value)
    note(client, "resume", lifted.label, by=by)
    return lifted


def in_force(app: Any) -> list[Pause]:
    """Every pause in force, oldest first."""
    return sorted(get_client(app).store.pauses(), key=lambda p: (p.paused_ms, p.scope.value, p.value))


def as_json(pause: Pause) -> dict[str, str]:
    """*pause* as the CLI's ``--json`` and the HTTP API show it."""
    return {"scope": pause.scope.value, "value": pause.value,
            "paused_at": from_epoch_ms(pause.paused_ms).isoformat(), "by": pause.by,
            "reason": pause.reason}
