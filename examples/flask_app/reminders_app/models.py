"""Reminder rows, and the scheduler key of each one's task."""

from __future__ import annotations

import datetime as dt
import sqlite3
from typing import Any

from celery_scheduler import TaskKey
from reminders_app.db import get_db


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat()


def create(user: str, text: str, remind_at_ms: int) -> int:
    db = get_db()
    cursor = db.execute("INSERT INTO reminder (user, text, remind_at_ms) VALUES (?, ?, ?)",
                        (user, text, remind_at_ms))
    db.commit()
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def get(reminder_id: int) -> sqlite3.Row | None:
    row: sqlite3.Row | None = get_db().execute(
        "SELECT * FROM reminder WHERE id = ?", (reminder_id,)).fetchone()
    return row


def task_key(reminder: sqlite3.Row) -> TaskKey:
    """The scheduler's key of the reminder's task: what status and cancel look up.

    Reminders of one user run in order (the ordering id is the user); the uniqueness key
    names the reminder, so scheduling it twice still sends it once.
    """
    return TaskKey(reminder["user"], reminder["remind_at_ms"], f"reminder-{reminder['id']}")


def mark(reminder_id: int, column: str) -> bool:
    """Set ``sent_at`` or ``cancelled_at`` once; False if it was already set."""
    assert column in ("sent_at", "cancelled_at")
    db = get_db()
    cursor = db.execute(f"UPDATE reminder SET {column} = ? WHERE id = ? AND {column} IS NULL",
                        (now_iso(), reminder_id))
    db.commit()
    return cursor.rowcount == 1


def describe(reminder: sqlite3.Row) -> dict[str, Any]:
    return {"id": reminder["id"], "user": reminder["user"], "text": reminder["text"],
            "remind_at": TaskKey("", reminder["remind_at_ms"], "").scheduled_at.isoformat(),
            "sent_at": reminder["sent_at"], "cancelled_at": reminder["cancelled_at"],
            "task_id": task_key(reminder).task_id}
