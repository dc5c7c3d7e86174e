"""The demo behind ``scripts/demo``: a dispatcher and a worker run scheduled reminders.

Starts ``celery scheduler dispatch`` and ``celery worker`` for ``examples.reminders``,
schedules three reminders each for two customers a few seconds ahead, prints each one as
the worker runs it, checks they ran in order per customer, and stops both processes.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from celery_scheduler import ScheduleHandle, TaskStatus
from examples.reminders import schedule_examples

TIMEOUT = 90
# A dispatcher stores successes in batches, within a second of the runs: how long the demo
# waits for every status to read finished before it prints them.
SETTLE_SECONDS = 10


def settled(handles: list[ScheduleHandle]) -> list[TaskStatus | None]:
    """The handles' statuses once all are finished, or as they are after SETTLE_SECONDS."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        statuses = [handle.status() for handle in handles]
        if all(s is not None and s.state.finished for s in statuses) or time.monotonic() > deadline:
            return statuses
        time.sleep(0.2)


def start(name: str, args: list[str], logs: Path) -> tuple[subprocess.Popen[bytes], Path]:
    path = logs / f"{name}.log"
    with path.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "celery", "-A", "examples.reminders", *args],
                                   stdout=out, stderr=subprocess.STDOUT)
    return process, path


def wait_for(path: Path, text: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + TIMEOUT
    while text not in path.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"demo: {path.stem} did not start; its log:\n{path.read_text(errors='replace')}")
        time.sleep(0.2)


def main() -> int:
    logs = Path(tempfile.mkdtemp(prefix="celery-scheduler-demo-"))
    dispatcher, dispatcher_log = start("dispatcher", ["scheduler", "dispatch"], logs)
    worker, worker_log = start("worker", ["worker", "--pool=solo", "--loglevel=INFO",
                                          "--without-gossip", "--without-mingle"], logs)
    try:
        wait_for(dispatcher_log, "leased partition", dispatcher)
        wait_for(worker_log, "ready.", worker)
        print("== dispatcher and worker are running; scheduling 6 reminders 5 seconds ahead")
        run = f"run-{uuid.uuid4().hex[:6]}"
        handles = schedule_examples(seconds_ahead=5, run=run)
        for handle in handles:
            print(f"   scheduled {handle.envelope.args[1]:<8} for {handle.key.ordering_id:<6} at "
                  f"{handle.key.scheduled_at:%H:%M:%S.%f} UTC")
        print("== waiting for the worker to run them")
        seen: list[str] = []
        deadline = time.monotonic() + TIMEOUT
        while len(seen) < len(handles):
            if time.monotonic() > deadline:
                print(f"demo: only {len(seen)} of {len(handles)} ran; logs in {logs}")
                return 1
            # earlier runs' reminders still pending run too (nothing is lost); count ours
            lines = re.findall(rf"REMINDER (\w+): (\w+) - .* {run}$", worker_log.read_text(errors="replace"),
                               re.MULTILINE)
            for customer, step in lines[len(seen):]:
                print(f"   {time.strftime('%H:%M:%S')} ran {step:<8} for {customer}")
                seen.append(f"{customer}:{step}")
            time.sleep(0.1)
        for customer in ("alice", "bob"):
            steps = [s.split(":")[1] for s in seen if s.startswith(customer)]
            if steps != ["welcome", "tips", "survey"]:
                print(f"demo: {customer}'s reminders ran out of order: {steps}")
                return 1
        print("== all 6 ran, in order for each customer; statuses:")
        for handle, status in zip(handles, settled(handles), strict=True):
            print(f"   {handle.key.ordering_id:<6} {handle.envelope.args[1]:<8} "
                  f"{status.state.value if status else 'unknown'}")
        return 0
    finally:
        for process in (dispatcher, worker):
            process.send_signal(signal.SIGTERM)
        for process in (dispatcher, worker):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        print(f"== dispatcher and worker stopped (logs in {logs})")


if __name__ == "__main__":
    sys.exit(main())
