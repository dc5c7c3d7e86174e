"""The operators' log: who paused, resumed, cancelled, retried or changed what, and when.

Every operator's lever writes a line here once it has acted (the CLI, the HTTP API, the
console and the Python functions behind them alike); ``celery scheduler audit``,
``GET /api/v1/audit`` and the console's Operators' log page read it, newest first. Lines are
kept in Cassandra for 90 days. A line that cannot be written (Cassandra went away just
after the action) is logged as a warning: the action itself stands.
"""

from __future__ import annotations

import getpass
import logging
import socket
from typing import Any

from celery_scheduler.client import SchedulerClient, get_client
from celery_scheduler.errors import SchedulerError
from celery_scheduler.keys import TaskKey, from_epoch_ms
from celery_scheduler.store.base import OperatorLog
from celery_scheduler.store.records import OperatorAction, PauseScope

__all__ = ["about", "as_json", "note", "operator", "recent", "said"]

logger = logging.getLogger(__name__)


def operator() -> str:
    """Who this process acts for: its user and host."""
    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"
    except (KeyError, OSError):  # no user name in a bare container
        return socket.gethostname()


def note(client: SchedulerClient, action: str, target: str, detail: str = "",
         by: str | None = None) -> OperatorAction:
    """Write *action* on *target* by *by* (this process's user by default) to the log."""
    line = OperatorAction(client.clock(), by if by is not None else operator(), action, target, detail)
    try:
        client.store.note_action(line)
    except SchedulerError as exc:
        logger.warning("%s of %s was done, but could not be written to the operators' log: %s",
                       action, target, exc)
    return line


def recent(app: Any, limit: int = 100) -> list[OperatorAction]:
    """The last *limit* lines of the log, newest first."""
    client = get_client(app)
    return client.store.actions(limit, client.clock())


def about(store: OperatorLog, key: TaskKey, task: str | None, now_ms: int,
          limit: int = 1000) -> list[OperatorAction]:
    """The lines, among the last *limit*, that acted on *key*: on it, its ordering id, its
    task name, or everything (newest first)."""
    named = {str(key), f"{PauseScope.ORDERING_ID.value} {key.ordering_id!r}", "everything"}
    if task is not None:
        named.add(f"{PauseScope.TASK.value} {task!r}")
    selection = f"ordering id {key.ordering_id!r}"  # a bulk cancel's
    return [line for line in store.actions(limit, now_ms)
            if line.target in named or line.target == selection
            or line.target.startswith(selection + ",")]


def said(action: OperatorAction) -> str:
    """One line of the log as text."""
    detail = f" ({action.detail})" if action.detail else ""
    return (f"{from_epoch_ms(action.at_ms).isoformat(timespec='seconds')} {action.actor}: "
            f"{action.action} {action.target}{detail}")


def as_json(action: OperatorAction) -> dict[str, str]:
    return {"at": from_epoch_ms(action.at_ms).isoformat(),
            "actor": action.actor, "action": action.action, "target": action.target,
            "detail": action.detail}
