"""A task sent on the local Redis broker runs in a real Celery worker process."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.redis


def test_task_round_trips_through_a_worker_process(start_worker, unique_name: str) -> None:
    from tests.apps.roundtrip import add

    worker = start_worker("tests.apps.roundtrip", unique_name)

    result = add.apply_async((2, 3), queue=unique_name)

    outcome = result.get(timeout=30)
    assert outcome["sum"] == 5
    # it ran in the worker subprocess (solo pool: the worker's own pid), not in this one
    assert outcome["pid"] == worker.pid != os.getpid()
    assert result.id in worker.log()
