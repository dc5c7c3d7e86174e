"""A small JSON API: create a reminder, and see it with its scheduler status."""

from __future__ import annotations

import time
from typing import Any

from flask import Blueprint, abort, request

from reminders_app import models
from reminders_app.tasks import send_reminder

bp = Blueprint("reminders", __name__, url_prefix="/reminders")


@bp.post("/")
def create_reminder() -> tuple[dict[str, Any], int]:
    """``POST {"user": ..., "text": ..., "in_seconds": 3600}`` creates and schedules a reminder."""
    body = request.get_json(silent=True) or {}
    try:
        user, text, delay = str(body["user"]), str(body["text"]), float(body["in_seconds"])
    except (ValueError, KeyError, TypeError) as exc:
        abort(400, f"expected JSON with user, text and in_seconds: {exc}")
    remind_at_ms = time.time_ns() // 1_000_000 + int(delay * 1000)
    # Committed first: the worker never runs before it can read the row.
    reminder = models.get(models.create(user, text, remind_at_ms))
    assert reminder is not None
    key = models.task_key(reminder)
    handle = send_reminder.schedule_at(key.scheduled_at, reminder["id"], user)
    assert handle.key == key  # the row and the task agree on the key
    return models.describe(reminder), 201


@bp.get("/<int:reminder_id>")
def reminder_status(reminder_id: int) -> dict[str, Any]:
    """The reminder, with its task's state in the scheduler."""
    reminder = models.get(reminder_id)
    if reminder is None:
        abort(404)
    status = send_reminder.status(models.task_key(reminder))
    return {**models.describe(reminder),
            # unknown until a dispatcher has stored the task
            "status": status.state.value if status else "unknown",
            "attempts": status.attempts if status else 0}
