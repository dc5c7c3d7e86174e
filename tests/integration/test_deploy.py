"""The timings docs/deploy.md's recipes rely on, measured against the real services: how long
a dispatcher takes to hand over and exit on SIGTERM (the stop timeout and the grace period),
and how long ``dispatch --check`` takes (the readiness probe's timeout)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

from tests.integration.dispatch_fixtures import APP, Scheduler
from tests.integration.test_dispatch import (
    check_order_and_no_overlap,
    distinct_runs,
    schedule_grid,
    seqs_in_order,
)
from tests.services import REPO
from tests.unit.test_deploy_docs import CHECK_BOUND_SECONDS, HAND_OVER_BOUND_SECONDS
from tests.waiting import wait_until


def test_a_dispatcher_stopped_with_sigterm_hands_over_and_exits_within_the_bound(
        scheduler: Scheduler, schedule: Any) -> None:
    staying = scheduler.dispatcher()
    leaving = scheduler.dispatcher()  # takes half of the partitions from the first
    scheduler.wait_for_log(staying, "revoked", timeout=60)
    scheduler.worker()
    ordering_ids = schedule_grid(schedule, ordering_ids=12, per_id=25, spacing=0.4, duration=0.0,
                                 delay=2.0)
    scheduler.wait_for_starts(60, timeout=60)  # mid-stream: it is releasing tasks
    asked = time.monotonic()
    leaving.terminate()
    leaving.wait(timeout=60)
    took = time.monotonic() - asked
    print(f"SIGTERM to exit: {took:.2f}s")

    assert leaving.returncode == 0, scheduler.log_of(leaving)[-3000:]
    assert "handed over partitions" in scheduler.log_of(leaving)
    assert took < HAND_OVER_BOUND_SECONDS, scheduler.log_of(leaving)[-3000:]
    wait_until(lambda: distinct_runs(scheduler) >= 300, 90, scheduler.starts)
    seqs_in_order(check_order_and_no_overlap(scheduler), {o: 25 for o in ordering_ids})
    assert staying.poll() is None


def test_dispatch_check_says_ok_and_answers_in_time_when_nothing_is_reachable(
        scheduler: Scheduler) -> None:
    started = time.monotonic()
    healthy = scheduler.cli("dispatch", "--check", timeout=60)
    print(f"dispatch --check, services up: {time.monotonic() - started:.2f}s")
    assert (healthy.returncode, healthy.stdout.strip()) == (0, "ok"), healthy.stderr

    nowhere = {**os.environ, "CELERY_SCHEDULER_TEST_KAFKA": "127.0.0.1:1",
               "CELERY_SCHEDULER_TEST_CASSANDRA_PORT": "1",
               "CELERY_SCHEDULER_TEST_BROKER": "redis://127.0.0.1:1/1"}
    started = time.monotonic()
    down = subprocess.run([sys.executable, "-m", "celery", "-A", APP, "scheduler", "dispatch",
                           "--check"], cwd=REPO, env=nowhere, capture_output=True, text=True,
                          timeout=120)
    took = time.monotonic() - started
    print(f"dispatch --check, nothing reachable: {took:.2f}s")
    assert down.returncode == 1
    problems = [line for line in down.stderr.splitlines() if line.startswith("unhealthy: ")]
    assert [p.split(":")[1].strip() for p in problems] == ["kafka", "cassandra", "broker"], down.stderr
    assert took < CHECK_BOUND_SECONDS, down.stderr
