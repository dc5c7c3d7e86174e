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


def test_the_committed_reference_pages_are_what_the_code_makes() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "scripts" / "docs_hooks.py")
    assert spec and spec.loader
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    pages = hooks.reference_pages()
    assert set(pages) == {"settings.md", "cli.md"}
    stale = [name for name, text in pages.items() if (REPO / "docs" / name).read_text() != text]
    assert stale == [], "run python scripts/docs_hooks.py and commit docs/" + ", docs/".join(stale)
