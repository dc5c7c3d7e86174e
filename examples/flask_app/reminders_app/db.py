"""SQLite through the standard library, as in Flask's tutorial."""

from __future__ import annotations

import sqlite3

import click
from flask import Flask, current_app, g
from flask.cli import with_appcontext

SCHEMA = """
CREATE TABLE IF NOT EXISTS reminder (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    user TEXT NOT NULL,
    text TEXT NOT NULL,
    remind_at_ms INTEGER NOT NULL,
    sent_at TEXT,
    cancelled_at TEXT
);
"""


def get_db() -> sqlite3.Connection:
    if "db" not in g:
        g.db = sqlite3.connect(current_app.config["DATABASE"], timeout=10)
        g.db.row_factory = sqlite3.Row
    connection: sqlite3.Connection = g.db
    return connection


def close_db(exc: BaseException | None = None) -> None:
    connection = g.pop("db", None)
    if connection is not None:
        connection.close()


def init_db() -> None:
    get_db().executescript(SCHEMA)


@click.command("init-db")
@with_appcontext
def init_db_command() -> None:
    """Create the reminder table (idempotent)."""
    init_db()
    click.echo("database ready")


def init_app(app: Flask) -> None:
    app.teardown_appcontext(close_db)
    app.cli.add_command(init_db_command)
