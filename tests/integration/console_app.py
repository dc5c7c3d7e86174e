"""The console of tests.apps.dispatching on the topic and keyspace the environment names,
for uvicorn (``--factory tests.integration.console_app:make``)."""

from __future__ import annotations

import os
from typing import Any


def make() -> Any:
    from celery_scheduler.client import SchedulerClient, set_client
    from celery_scheduler.config import get_settings
    from celery_scheduler.web import create_app
    from tests.apps import dispatching

    tokens = dict(pair.split("=", 1) for pair in os.environ["CONSOLE_TOKENS"].split(","))
    settings = get_settings(dispatching.app).replace(api_tokens=tokens)
    set_client(dispatching.app, SchedulerClient(settings))
    return create_app(dispatching.app)
