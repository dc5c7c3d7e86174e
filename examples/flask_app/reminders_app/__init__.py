"""The reminders example as a Flask application factory, with Celery as Flask's docs wire it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from flask import Flask

# Celery's settings and the scheduler's (scheduler_*), for a laptop with the local services.
CELERY_DEFAULTS: Mapping[str, Any] = {
    "broker_url": "redis://127.0.0.1:6379/0",
    "task_default_queue": "flask_reminders",
    "task_ignore_result": True,  # the scheduler records outcomes itself
    "broker_connection_retry_on_startup": True,
    "scheduler_kafka_bootstrap_servers": "127.0.0.1:9092",
    "scheduler_kafka_topic": "flask_reminders",
    "scheduler_kafka_partitions": 6,
    "scheduler_cassandra_contact_points": "127.0.0.1",
    "scheduler_cassandra_keyspace": "flask_reminders",
}


def create_app(test_config: Mapping[str, Any] | None = None) -> Flask:
    """Build the app; settings come from ``FLASK_*`` environment variables or *test_config*.

    Nested Celery settings are set with a double underscore, as ``from_prefixed_env`` reads
    them: ``FLASK_CELERY__scheduler_kafka_topic=reminders``.
    """
    app = Flask(__name__, instance_relative_config=True)
    app.config.from_mapping(
        DATABASE=os.path.join(app.instance_path, "reminders.sqlite"),
        CELERY=dict(CELERY_DEFAULTS),
    )
    app.config.from_prefixed_env()
    if test_config is not None:
        app.config.from_mapping(test_config)
    os.makedirs(os.path.dirname(app.config["DATABASE"]), exist_ok=True)

    from reminders_app import db
    from reminders_app.celery import celery_init_app

    db.init_app(app)
    celery_init_app(app)
    # The views import the tasks: @scheduled_task looks its @shared_task up in the Celery
    # app made just above, so they are imported only now.
    from reminders_app import commands, views

    app.register_blueprint(views.bp)
    commands.init_app(app)
    return app
