"""pytest plugin: the ``celery_scheduler`` fixture (registered through the ``pytest11`` entry point).

It follows the ``celery_app`` fixture convention of ``celery.contrib.pytest``: define a
``celery_app`` fixture that returns your app (or enable Celery's plugin, whose
``celery_app`` is a test app), and ask for ``celery_scheduler``::

    @pytest.fixture
    def celery_app():
        return proj.celery.app

    def test_reminder(celery_scheduler):
        proj.tasks.send_reminder.schedule_in(3600, "customer-42")
        [run] = celery_scheduler.advance(3600)
        assert run.succeeded

See :func:`celery_scheduler.testing.scheduler_testing` for what runs inside.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from celery_scheduler.errors import ConfigurationError
from celery_scheduler.testing import SchedulerTesting, scheduler_testing

__all__ = ["celery_scheduler"]


@pytest.fixture
def celery_scheduler(request: pytest.FixtureRequest) -> Iterator[SchedulerTesting]:
    """The ``celery_app`` fixture's app, its schedule calls run by an in-memory dispatcher."""
    try:
        app = request.getfixturevalue("celery_app")
    except pytest.FixtureLookupError:
        raise ConfigurationError(
            "the celery_scheduler fixture needs a celery_app fixture that returns your Celery "
            "app; define one in conftest.py, or enable celery.contrib.pytest") from None
    with scheduler_testing(app) as scheduler:
        yield scheduler
