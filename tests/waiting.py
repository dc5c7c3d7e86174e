"""The one way the tests wait: for a condition, never for a length of time.

A test that sleeps before it asserts is slow when the machine is fast and flaky when it is
slow; one that polls for what it expects is neither. To show that something did *not*
happen, wait for a later event that could only come after it (the next task of the same
ordering id, a marker task), not for a fixed time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from celery_scheduler.store.base import State

__all__ = ["wait_for_states", "wait_until"]

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout: float,
               what: str | Callable[[], object] = "the condition", every: float = 0.1) -> T:
    """Poll *condition* every *every* seconds until it returns something true, and return it.

    After *timeout* seconds the test fails, naming *what* (a callable is called then, so the
    message can show the state that was not reached: a log's tail, the statuses).
    """
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            shown = what() if callable(what) else what
            pytest.fail(f"not reached after {timeout}s: {shown}", pytrace=False)
        time.sleep(every)
    return value


def wait_for_states(handles: list[Any], state: State, timeout: float = 20) -> None:
    """Wait until the status of every one of *handles* (schedule handles) is *state*."""
    def states() -> list[State | None]:
        return [getattr(h.status(), "state", None) for h in handles]

    wait_until(lambda: all(s is state for s in states()), timeout, states)
