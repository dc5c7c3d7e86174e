"""How late plain Celery tasks start after a RabbitMQ restart, for each worker pool.

::

    python -m benchmarks.rabbitmq_restart --pool solo --pool threads --pool prefork

No scheduler is involved: a client sends one task every ``--interval`` seconds to one worker
(``--concurrency=1``, ``worker_prefetch_multiplier = 1``, ``task_acks_late = True``), the
local RabbitMQ is restarted through ``scripts/services`` a few seconds in, and each task
logs when it started. Printed per pool: the lateness (start minus send) of the tasks sent
after the broker came back. This restarts the development RabbitMQ (127.0.0.1:5672): run
it when nothing else uses it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from celery import Celery

REPO = Path(__file__).resolve().parent.parent
BROKER = os.environ.get("CELERY_SCHEDULER_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672//")
QUEUE = "rabbitmq-restart-probe"
LOG = os.environ.get("BENCH_RESTART_LOG", "")

app = Celery("rabbitmq_restart", broker=BROKER, set_as_current=False)
app.conf.update(
    task_default_queue=QUEUE, worker_prefetch_multiplier=1, task_acks_late=True,
    worker_enable_prefetch_count_reduction=os.environ.get("BENCH_PREFETCH_REDUCTION") == "1",
    broker_connection_retry_on_startup=True, broker_connection_max_retries=None,
    worker_hijack_root_logger=False)


@app.task(name="rabbitmq_restart.probe")
def probe(sent: float, duration: float = 0.0) -> None:
    started = time.time()
    with open(LOG, "a") as handle:  # one short append: atomic on Linux
        handle.write(json.dumps({"sent": sent, "started": started}) + "\n")
    time.sleep(duration)


def services(*args: str) -> None:
    subprocess.run([str(REPO / "scripts" / "services"), *args, "rabbitmq"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def measure(pool: str, seconds: float, interval: float, duration: float, restart_at: float) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "starts.jsonl"
        env = {**os.environ, "BENCH_RESTART_LOG": str(log)}
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "benchmarks.rabbitmq_restart", "worker",
             f"--pool={pool}", "--concurrency=1", "--without-gossip", "--without-mingle",
             "--without-heartbeat", "-Q", QUEUE, "--loglevel=WARNING"],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(5)
            start, restarted_at, failed = time.time(), 0.0, 0
            while time.time() - start < seconds:
                if not restarted_at and time.time() - start >= restart_at:
                    services("down")
                    services("up")
                    restarted_at = time.time()
                try:
                    with app.connection_for_write() as connection:  # a fresh one: sent at once
                        probe.apply_async((time.time(), duration), connection=connection)  # type: ignore[call-arg]
                except Exception:
                    failed += 1
                time.sleep(interval)
            time.sleep(max(10.0, seconds / 2))  # let the last ones start
        finally:
            worker.terminate()
            worker.wait(timeout=30)
        rows = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    after = [r["started"] - r["sent"] for r in rows if r["sent"] >= restarted_at]
    if not after:
        return f"{pool:8} no task sent after the restart started"
    after.sort()
    p99 = after[min(len(after) - 1, int(len(after) * 0.99))]
    return (f"{pool:8} {len(after)} tasks sent after the restart: lateness p50 "
            f"{statistics.median(after):.2f} s, p99 {p99:.2f} s, max {after[-1]:.2f} s; "
            f"{sum(x > 2 for x in after)} over 2 s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--pool", action="append", help="worker pool (repeatable; default solo, threads)")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long tasks are sent")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between tasks")
    parser.add_argument("--duration", type=float, default=0.0, help="seconds each task runs")
    parser.add_argument("--restart-at", type=float, default=15.0, help="when RabbitMQ restarts")
    args = parser.parse_args()
    for pool in args.pool or ["solo", "threads"]:
        print(measure(pool, args.seconds, args.interval, args.duration, args.restart_at), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
