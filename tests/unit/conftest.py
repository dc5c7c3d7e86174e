"""Fixtures shared by the unit tests."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest

from celery_scheduler.testing import SchedulerTesting, scheduler_testing
from tests.unit.apps import app

# when the fake clock of the ``scheduler`` fixture starts
START = dt.datetime(2030, 1, 1, 9, 0, tzinfo=dt.timezone.utc)


@pytest.fixture
def scheduler() -> Iterator[SchedulerTesting]:
    """The unit tests' app, its schedule calls kept and run in memory on a fake clock."""
    with scheduler_testing(app, start=START) as testing:
        yield testing
