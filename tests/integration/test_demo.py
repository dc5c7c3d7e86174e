"""The README's main command keeps working: the demo's reminders run, in order."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.services import REPO

pytestmark = [pytest.mark.kafka, pytest.mark.cassandra, pytest.mark.redis]


def test_demo_runs_reminders_in_order(kafka_bootstrap: str, cassandra_contact: str, redis_url: str) -> None:
    init = subprocess.run([sys.executable, "-m", "celery", "-A", "examples.reminders", "scheduler", "init"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert init.returncode == 0, init.stderr
    demo = subprocess.run([sys.executable, "-m", "examples.demo"], cwd=REPO, capture_output=True,
                          text=True, timeout=240)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "all 6 ran, in order for each customer" in demo.stdout
    assert demo.stdout.count("succeeded") == 6
