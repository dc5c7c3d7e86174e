"""Scenario 8: the engine's ceiling, with workers that report each outcome at once.

The same overdue backlog as scenario 6, drained by one dispatcher through the real Kafka,
Cassandra and Redis, but the Celery workers are replaced by ``benchmarks.instant_worker``:
it takes each released message and reports its success to the outcomes topic immediately.
What is left is the scheduler's own pipeline (loading, releasing, publishing, outcomes),
so its rate is the most one dispatcher can release on this machine.

::

    python -m benchmarks.ceiling [--tasks 100000] [--dispatchers 1] [--runs 1]

runs it alone and prints each run's rate and CPU per task of each part; with
``--dispatchers N``, N dispatchers started together share the partitions (where one
interpreter's ceiling is not the limit, the machine's is).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.backlog import Drain, measure_drain
from benchmarks.context import Context
from benchmarks.cpu import add_rows
from benchmarks.drain import line
from benchmarks.harness import stack
from benchmarks.populate import populate
from benchmarks.report import Section
from benchmarks.stats import Figure

__all__ = ["run"]


def ceiling(ctx: Context, tasks: int, ordering_ids: int, window: float, fill_seconds: float,
            dispatchers: int = 1) -> Drain:
    with stack(ctx.tmp) as s:
        app = s.use_client()
        base = time.time() + ctx.pick(1, 5)
        spacing = 2e-4
        tasks, fill_rate = populate(s, app, ((f"o{i % ordering_ids}", i, base + i * spacing)
                                             for i in range(tasks)), fill_seconds)
        time.sleep(max(0.0, base + tasks * spacing + 1 - time.time()))
        marker = s.tmp / f"{s.name}-instant.ready"
        worker = s.spawn("instant", [sys.executable, "-m", "benchmarks.instant_worker"],
                         {"BENCH_READY_FILE": str(marker)})
        s._wait(worker, marker.exists, "instant worker", 60)
        launched = time.time()
        started = [s.dispatcher(wait=False) for _ in range(dispatchers)]
        return measure_drain(s, tasks, window, launched, fill_rate,
                             {"dispatcher": [process.pid for process in started],
                              "instant worker": [worker.pid]})


def run(ctx: Context) -> list[Section]:
    window = ctx.pick(8, 40)
    tasks = ctx.pick(3_000, 100_000)
    runs = [ceiling(ctx, tasks, tasks // 10, window, ctx.pick(3, 60)) for _ in range(ctx.pick(1, 3))]
    eight = Section("8", "Engine ceiling: one dispatcher, outcomes reported at once")
    rate = Figure.of([d.rate for d in runs], "tasks/s")
    eight.add(f"{runs[0].tasks:,} tasks, {tasks // 10:,} ordering ids x 10: released and reported, "
              "from launch", rate, "≥ 5,000 tasks/s in every run", rate.low >= 5000)
    eight.add("... from the first start to the last", Figure.of([d.steady_rate for d in runs],
                                                                  "tasks/s"))
    eight.add("tasks started within the window", Figure.of([d.started / d.tasks for d in runs], "%", 1))
    eight.add("ordering ids whose tasks started out of order", Figure.of([d.out_of_order for d in runs]),
              "0", all(d.out_of_order == 0 for d in runs))
    add_rows(eight, "celery_scheduler", [d.cpu for d in runs], [d.cpu_tasks for d in runs])
    eight.method = [
        "the backlog of scenario 6 (written straight into the scheduler's tables, all overdue), "
        "drained by one dispatcher; instead of Celery workers, one process takes each released "
        "message from Redis and reports its success to the outcomes topic at once (the "
        "package's own outcome producer), logging it as started. Nothing runs a task body.",
        f"rate = tasks logged / time from the dispatcher's launch to the last, over a window of "
        f"{window} s (the rate from the first to the last is shown beside it); CPU per part from "
        "the first start to the end of the wait.",
    ]
    return [eight]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ceiling", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=100_000, help="tasks in the backlog")
    parser.add_argument("--dispatchers", type=int, default=1, help="dispatchers started together")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="celery-scheduler-ceiling-") as tmp:
        ctx = Context(quick=False, tmp=Path(tmp), runs=args.runs)
        for number in range(1, args.runs + 1):
            result = ceiling(ctx, args.tasks, max(1, args.tasks // 10), 60, 60, args.dispatchers)
            print(line(f"run {number}, {args.dispatchers} dispatcher(s)", result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
