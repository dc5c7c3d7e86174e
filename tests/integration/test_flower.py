"""Released tasks in Flower: its API lists them under their key's task id, with their name,
arguments and state, and its tasks page, opened in headless Chromium, shows them."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.dispatch_fixtures import Scheduler
from tests.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.cassandra, pytest.mark.redis]
UTC = dt.timezone.utc


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("chromium is not installed (scripts/test installs Debian's chromium)")
    return found


def test_released_tasks_show_in_flowers_api_and_tasks_page(
        scheduler: Scheduler, schedule: Callable[..., Any], tmp_path: Any) -> None:
    browser = chromium()
    scheduler.dispatcher()
    scheduler.worker("-E")  # task events, which Flower shows
    port = _free_port()
    flower = scheduler._spawn("flower", [
        scheduler.python, "-m", "celery", "-A", "tests.apps.dispatching", "flower",
        f"--port={port}", "--address=127.0.0.1"], {"FLOWER_UNAUTHENTICATED_API": "true"})
    scheduler.wait_for_log(flower, "Visit me at", timeout=60)
    # Flower subscribes to the workers' events some time after it is up: a marker task is
    # scheduled, every few seconds, until Flower lists one
    markers: list[str] = []
    marked = [0.0]

    def flower_lists_a_marker() -> bool:
        tasks = _get(f"http://127.0.0.1:{port}/api/tasks")
        if any(task_id in tasks for task_id in markers):
            return True
        if time.monotonic() > marked[0] + 3:
            marked[0] = time.monotonic()
            now = dt.datetime.now(UTC)
            markers.append(schedule.record.schedule_at(now, "marker", len(markers),
                                                       scheduled_for=now.timestamp()).task_id)
        return False

    wait_until(flower_lists_a_marker, 60, lambda: f"{len(markers)} marker(s), none in Flower",
               every=0.5)

    due = dt.datetime.now(UTC) + dt.timedelta(seconds=2)
    handles = [schedule.record.schedule_at(due, f"flower-{n}", n, scheduled_for=due.timestamp())
               for n in range(2)]
    scheduler.wait_for_starts(len(markers) + 2, timeout=60)
    wanted = {handle.task_id: handle for handle in handles}
    deadline = time.monotonic() + 30
    while True:
        tasks = _get(f"http://127.0.0.1:{port}/api/tasks")
        seen = {task_id: tasks[task_id] for task_id in wanted if task_id in tasks}
        if (len(seen) == 2 and all(t["state"] == "SUCCESS" for t in seen.values())) or (
                time.monotonic() > deadline):
            break
        time.sleep(0.5)
    assert set(seen) == set(wanted), f"Flower lists {sorted(tasks)}"
    for task_id, task in seen.items():
        n = wanted[task_id].envelope.args[1]
        assert (task["name"], task["state"]) == ("dispatching.record", "SUCCESS")
        assert f"'flower-{n}', {n}" in task["args"]

    page = f"http://127.0.0.1:{port}/tasks"
    options = ["--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=10000"]
    dom = subprocess.run([browser, *options, "--dump-dom", page], capture_output=True, text=True,
                         timeout=120).stdout
    for task_id in wanted:
        assert task_id in dom, "the tasks page does not show a released task"
    shot = tmp_path / "flower-tasks.png"
    subprocess.run([browser, *options, f"--screenshot={shot}", "--window-size=1400,700", page],
                   capture_output=True, timeout=120, check=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
