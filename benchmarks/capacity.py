"""Lateness against load: the steady rate each system keeps punctual on this machine.

Scenario 3's load (task i due at ``t0 + i / rate``, published ``lead`` seconds before,
1,000 ordering ids, two solo Celery workers) at a rising series of rates, for
celery_scheduler and Celery's own ``eta=``, each on processes of its own that serve every
rate in turn. Each rate prints its lateness, the machine's busy share, and the CPU a task
took in every part, with their sum times the rate: the cores the load asks of the machine
(celery_scheduler's p99 split, as in scenario 3, at the dispatcher's publish to Celery).
Once that demand nears the machine's cores, tasks queue for CPU and lateness grows for as
long as the load lasts, whatever the scheduler does; the rate where each system stops
keeping up shows how much of the machine a task costs it.

::

    python -m benchmarks.capacity [--rates 400,600,800,1000] [--duration 30]
                                  [--systems "celery_scheduler,Celery eta="]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from benchmarks.context import Context
from benchmarks.lateness import SYSTEMS, WARM_UP_SEQ, Load, Outcome, measure, systems
from benchmarks.stats import percentile

__all__ = ["main", "punctual", "row"]

LEAD_SECONDS = 5.0
GRACE_SECONDS = 20.0
PUNCTUAL_MS = 100.0  # scenario 3's p99 target


def punctual(outcome: Outcome) -> bool:
    """Published on time, 99% run by the deadline, p99 within PUNCTUAL_MS: a run whose
    load was published late measured the load generator, not the scheduler."""
    return outcome.valid and outcome.ran >= 0.99 and outcome.ms(99) <= PUNCTUAL_MS


def row(system: str, rate: float, outcome: Outcome) -> str:
    """One markdown table row: lateness, busy share, CPU a task by part, and the demand."""
    tasks = len(outcome.lateness)
    cpu = outcome.cpu
    parts = cpu.ms_per_task(tasks) if cpu is not None else {}
    total = sum(parts.values())
    busy = f"{100 * cpu.busy:.0f}%" if cpu is not None else "n/a"
    by_part = ", ".join(f"{part} {ms:.2f}" for part, ms in parts.items() if ms >= 0.005)
    kept = "yes" if punctual(outcome) else "no"
    split = (f"{1000 * percentile(outcome.to_release, 99):,.1f} / "
             f"{1000 * percentile(outcome.after_release, 99):,.1f}"
             if outcome.to_release and outcome.after_release else "")
    return (f"| {system} | {rate:g} | {outcome.ms(50):,.1f} | {outcome.ms(99):,.1f} | {split} | "
            f"{100 * outcome.ran:.1f}% | {kept} | {busy} | {total:.2f} | {total * rate / 1000:.2f} | "
            f"{by_part} |")


HEADER = ("| system | due/s | p50 ms | p99 ms | p99 ms: due to published / published to started "
          "| run by deadline | punctual | machine busy | CPU ms a task | cores asked "
          "| CPU ms a task, by part |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.capacity", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="400,600,800,1000",
                        help="comma-separated due tasks/s, run in this order")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of load at each rate")
    parser.add_argument("--systems", default=",".join(SYSTEMS[:2]),
                        help=f"comma-separated, of: {', '.join(SYSTEMS)}")
    args = parser.parse_args(argv)
    rates = [float(rate) for rate in args.rates.split(",") if rate.strip()]
    chosen = [name.strip() for name in args.systems.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in SYSTEMS]
    if unknown or not rates or any(rate <= 0 for rate in rates):
        parser.error(f"--systems must name some of {SYSTEMS} (got {unknown or chosen}), "
                     f"--rates positive numbers (got {args.rates!r})")
    print(f"{args.duration:g} s at each rate, published {LEAD_SECONDS:g} s ahead; "
          f"punctual = published on time, p99 <= {PUNCTUAL_MS:g} ms and >= 99% run by "
          f"{GRACE_SECONDS:g} s after the last due time; {os.cpu_count()} cores", flush=True)
    print(HEADER, flush=True)
    warm = Load(rate=100, duration=10, lead=LEAD_SECONDS, grace=15)
    with tempfile.TemporaryDirectory(prefix="celery-scheduler-capacity-") as tmp:
        ctx = Context(quick=False, tmp=Path(tmp), runs=1)
        for system in chosen:
            with systems(ctx, system) as (s, publish, flush):
                measure(s, publish, flush, warm, WARM_UP_SEQ)
                for number, rate in enumerate(rates, 1):
                    load = Load(rate=rate, duration=args.duration, lead=LEAD_SECONDS,
                                grace=GRACE_SECONDS)
                    outcome = measure(s, publish, flush, load, number * 10_000_000)
                    print(row(system, rate, outcome), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
