"""The documentation names every setting and the public surface is what the docs show."""

from __future__ import annotations

from dataclasses import fields

import celery_scheduler
from celery_scheduler.config import PREFIX, Settings
from tests.services import REPO


def test_every_setting_is_documented() -> None:
    text = (REPO / "docs" / "configuration.md").read_text()
    missing = [f.name for f in fields(Settings) if f"`{PREFIX}{f.name}`" not in text]
    assert missing == []


def test_public_api() -> None:
    assert set(celery_scheduler.__all__) == {
        "Call", "RetryPolicy", "ScheduleHandle", "ScheduledBatch", "ScheduledTask", "State",
        "TaskKey", "TaskStatus",
        "__version__", "as_scheduled", "constant", "flush", "schedule_message", "scheduled_task",
    }
    for name in celery_scheduler.__all__:
        assert getattr(celery_scheduler, name) is not None
