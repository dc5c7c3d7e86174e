"""Scenario 8: the engine's ceiling, with workers that report each outcome at once.

The same overdue backlog as scenario 6, drained by one dispatcher through the real Kafka,
Cassandra and Redis, but the Celery workers are replaced by ``benchmarks.instant_worker``:
it takes each released message and reports its success to the outcomes topic immediately.
What is left is the scheduler's own pipeline (loading, releasing, publishing, outcomes),
so its rate is the most one dispatcher can release on this machine.
"""

from __future__ import annotations

import sys
import time

from benchmarks.backlog import Drain, measure_drain
from benchmarks.context import Context
from benchmarks.cpu import add_rows
from benchmarks.harness import stack
from benchmarks.populate import populate
from benchmarks.report import Section
from benchmarks.stats import Figure

__all__ = ["run"]


def ceiling(ctx: Context, tasks: int, ordering_ids: int, window: float, fill_seconds: float) -> Drain:
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
        dispatcher = s.dispatcher(wait=False)
        return measure_drain(s, tasks, window, launched, fill_rate,
                             {"dispatcher": [dispatcher.pid], "instant worker": [worker.pid]})


def run(ctx: Context) -> list[Section]:
    window = ctx.pick(8, 40)
    tasks = ctx.pick(3_000, 100_000)
    runs = [ceiling(ctx, tasks, tasks // 10, window, ctx.pick(3, 60)) for _ in range(ctx.pick(1, 2))]
    eight = Section("8", "Engine ceiling: one dispatcher, outcomes reported at once")
    rate = Figure.of([d.rate for d in runs], "tasks/s")
    eight.add(f"{runs[0].tasks:,} tasks, {tasks // 10:,} ordering ids x 10: released and reported",
              rate, "≥ 5,000 tasks/s", rate.median >= 5000)
    eight.add("tasks started within the window", Figure.of([d.started / d.tasks for d in runs], "%", 1))
    eight.add("ordering ids whose tasks started out of order", Figure.of([d.out_of_order for d in runs]),
              "0", all(d.out_of_order == 0 for d in runs))
    add_rows(eight, "celery_scheduler", [d.cpu for d in runs], [d.cpu_tasks for d in runs])
    eight.method = [
        "the backlog of scenario 6 (written straight into the scheduler's tables, all overdue), "
        "drained by one dispatcher; instead of Celery workers, one process takes each released "
        "message from Redis and reports its success to the outcomes topic at once (the "
        "package's own outcome producer), logging it as started. Nothing runs a task body.",
        f"rate = tasks logged / time from the first to the last, over a window of {window} s; "
        "CPU per part from the first start to the end of the wait.",
    ]
    return [eight]
