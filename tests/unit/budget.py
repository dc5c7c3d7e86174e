"""How many examples the property-based unit tests try.

The whole suite (``scripts/test``, and CI, which sets ``CI``) tries each test's full count;
a bare ``pytest tests/unit`` while working tries a fifth of it (at least 50), so that the
unit tier runs in under a minute. ``CELERY_SCHEDULER_THOROUGH=1`` asks for the full count
anywhere.
"""

from __future__ import annotations

import os

__all__ = ["THOROUGH", "examples"]

THOROUGH = bool(os.environ.get("CI") or os.environ.get("CELERY_SCHEDULER_THOROUGH"))


def examples(full: int) -> int:
    """The examples a property test tries: *full* in a thorough run, a fifth otherwise."""
    return full if THOROUGH else max(50, full // 5)
