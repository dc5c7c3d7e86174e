"""celery-longterm-scheduler, the Celery plugin peer: its periodic command, and clean-up.

``task.apply_async(eta=...)`` on its task class stores the call in Redis (a key per task and
one sorted set by due second) instead of sending it; ``celery longterm_scheduler`` sends every
stored call that is due and deletes it. Its documentation suggests running that command from
cron every 5 minutes. Here it runs once a second in one long-lived process
(``python -m benchmarks.peers_longterm``) calling what the command calls,
``Scheduler.execute_pending(now)``, so that the figures are not a Python start-up per second.

Once sent, a task is an ordinary Celery message: the benchmark's Celery workers run it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from typing import Any

import redis

from benchmarks.context import utc
from benchmarks.harness import Stack

__all__ = ["DOCUMENTED_INTERVAL", "INTERVAL", "PART", "clean", "schedule", "ticker"]

INTERVAL = 1.0  # seconds between two runs of the command here
DOCUMENTED_INTERVAL = 300.0  # "Set up a cronjob to run celery longterm_scheduler (e.g. every 5 minutes)"
READY = "longterm ticker running"
PART = "longterm_scheduler command"  # how the CPU rows name the ticker process


def schedule(app: Any, s: Stack, ordering_id: str, seq: int, due: float, task_id: str | None = None
             ) -> None:
    """Store one benchmark task due at *due*; its Celery task id names the stack (for clean-up)."""
    app.longterm.apply_async((ordering_id, seq, due), eta=utc(due), queue=s.name,
                             task_id=task_id or f"{s.name}-{seq}")


def ticker(s: Stack, interval: float = INTERVAL, aligned: bool = False) -> Any:
    """Start the process that runs the command's work every *interval* seconds; *aligned*:
    at the wall clock's multiples of it, as cron runs a job every 5 minutes."""
    process = s.spawn("longterm", [sys.executable, "-m", __name__, "--interval", str(interval),
                                   *(["--aligned"] if aligned else [])])
    deadline = time.monotonic() + 60
    while READY not in s.log_of(process):
        s.check_alive()
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"longterm ticker did not start: {s.log_of(process)[-3000:]}")
        time.sleep(0.1)
    return process


def clean(name: str) -> None:
    """Delete the stored tasks of stack *name* from the plugin's Redis database."""
    from benchmarks.app import LONGTERM_REDIS

    connection = redis.Redis.from_url(LONGTERM_REDIS)
    keys = list(connection.scan_iter(match=f"*{name}*", count=1000))
    for start in range(0, len(keys), 500):
        connection.delete(*keys[start:start + 500])
    index = "scheduled_task_id_by_time"  # the plugin's one sorted set
    members = [m for m, _ in connection.zscan_iter(index, match=f"*{name}*", count=1000)]
    for start in range(0, len(members), 500):
        connection.zrem(index, *members[start:start + 500])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="run celery longterm_scheduler's work periodically")
    parser.add_argument("--interval", type=float, default=INTERVAL)
    parser.add_argument("--aligned", action="store_true",
                        help="run at the wall clock's multiples of the interval, as cron does")
    args = parser.parse_args(argv)
    from celery_longterm_scheduler import get_scheduler

    from benchmarks.app import app

    scheduler = get_scheduler(app)
    print(READY, flush=True)
    if args.aligned:  # cron: the first run at the next multiple of the interval
        time.sleep(args.interval - time.time() % args.interval)
    next_run = time.monotonic()
    while True:
        scheduler.execute_pending(dt.datetime.now(dt.timezone.utc))
        next_run += args.interval
        time.sleep(max(0.0, next_run - time.monotonic()))


if __name__ == "__main__":
    sys.exit(main())
