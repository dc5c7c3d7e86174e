"""The version is written once, in ``celery_scheduler/__init__.py``; packaging reads it there."""

from __future__ import annotations

from importlib.metadata import version

import celery_scheduler


def test_package_version_is_the_distribution_version() -> None:
    assert celery_scheduler.__version__ == version("celery-scheduler")
