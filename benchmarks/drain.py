"""Scenario 6's backlog drain alone, for comparing changes: rate and CPU per task of each part.

::

    python -m benchmarks.drain [--tasks 100000] [--runs 1] [--celery]

Fills the backlog of scenario 6 (*tasks* over a tenth as many ordering ids, written straight
into the scheduler's tables), then starts two solo workers and one dispatcher and prints,
for each run, the drain rate (tasks started / time from the first start to the last, over
30 s) and the CPU per task of each part, as scenario 6 counts them. ``--celery`` also runs
Celery alone (the same tasks queued with ``apply_async``, no scheduler) after each run, and
prints the ratio. Every figure depends on what else the machine does: compare runs made
one after the other, alternating the versions compared.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from benchmarks.backlog import Drain, celery_drain, drain
from benchmarks.context import Context

WINDOW = 30
FILL_SECONDS = 60


def line(label: str, result: Drain) -> str:
    parts = ", ".join(f"{part} {ms:.3f}" for part, ms in result.cpu.ms_per_task(result.cpu_tasks).items())
    return (f"{label}: {result.rate:,.0f} tasks/s from launch ({result.steady_rate:,.0f} first start "
            f"to last; {result.started:,} of {result.tasks:,} started), "
            f"machine busy {100 * result.cpu.busy:.0f}%; CPU ms a task: {parts}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.drain", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=100_000, help="tasks in the backlog")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--celery", action="store_true", help="also drain Celery alone after each run")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="celery-scheduler-drain-") as tmp:
        ctx = Context(quick=False, tmp=Path(tmp), runs=args.runs)
        for number in range(1, args.runs + 1):
            ours = drain(ctx, args.tasks, max(1, args.tasks // 10), WINDOW, FILL_SECONDS)
            print(line(f"run {number}, celery_scheduler", ours), flush=True)
            if args.celery:
                alone = celery_drain(ctx, args.tasks, max(1, args.tasks // 10), WINDOW)
                print(line(f"run {number}, Celery alone", alone), flush=True)
                if alone.rate:
                    share = 100 * ours.rate / alone.rate
                    print(f"run {number}, celery_scheduler / Celery alone: {share:.0f}%", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
