"""``python -m benchmarks [--quick] [--only 1,3] [--output FILE]``: run the scenarios, write the report."""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import shlex
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from benchmarks import machine
from benchmarks.context import Context
from benchmarks.harness import REPO
from benchmarks.report import Report, Section, render

# scenario numbers → module with run(ctx) -> list[Section]; run in this order
SCENARIOS: dict[str, str] = {
    "1": "benchmarks.schedule",
    "1c": "benchmarks.spark_bulk",
    "2": "benchmarks.ingest",
    "3": "benchmarks.lateness",
    "3k": "benchmarks.delivery",
    "4": "benchmarks.memory",
    "5": "benchmarks.failover",
    "6": "benchmarks.backlog",
    "8": "benchmarks.ceiling",
    "9": "benchmarks.duplicates",
}
PACKAGES = ("celery", "kombu", "confluent-kafka", "cassandra-driver", "redis", "rq", "procrastinate",
            "psycopg", "celery-longterm-scheduler")


def _versions() -> dict[str, str]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "missing"
    return versions


def _scenario(number: str) -> Callable[[Context], list[Section]]:
    module = importlib.import_module(SCENARIOS[number])
    run: Callable[[Context], list[Section]] = module.run
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller counts, fewer runs (< 5 min)")
    parser.add_argument("--only", default="", help="comma-separated scenario groups, e.g. 1,3")
    parser.add_argument("--runs", type=int, default=None, help="repetitions of the short scenarios")
    parser.add_argument("--output", type=Path, default=None,
                        help="report file (default BENCHMARKS.md; a partial run only prints)")
    parser.add_argument("--command", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    chosen = [n.strip() for n in args.only.split(",") if n.strip()] or list(SCENARIOS)
    unknown = [n for n in chosen if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario group(s) {unknown}; known: {', '.join(SCENARIOS)}")
    output = args.output or (REPO / "BENCHMARKS.md" if chosen == list(SCENARIOS) else None)
    command = args.command or "python -m benchmarks " + shlex.join(sys.argv[1:] if argv is None else argv)
    started = time.monotonic()
    report = Report(command=command.strip(), mode="quick" if args.quick else "full",
                    started=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                    machine=machine.describe(), load_start=machine.load_average(),
                    versions=_versions())
    runs = args.runs or (2 if args.quick else 5)
    with tempfile.TemporaryDirectory(prefix="celery-scheduler-bench-") as tmp:
        ctx = Context(quick=args.quick, tmp=Path(tmp), runs=runs)
        for number in chosen:
            report.probes[number] = machine.speed_probe()
            print(f"[bench] scenario {number} ({SCENARIOS[number]}) at load {machine.load_average()}, "
                  f"speed probe {report.probes[number]:.1f} ms", file=sys.stderr, flush=True)
            began = time.monotonic()
            try:
                report.sections += _scenario(number)(ctx)
            except Exception as exc:
                traceback.print_exc()
                report.sections.append(Section(number, SCENARIOS[number].rsplit(".", 1)[-1],
                                               error=f"{type(exc).__name__}: {exc}"[:1000]))
            print(f"[bench] scenario {number} took {time.monotonic() - began:.0f}s", file=sys.stderr,
                  flush=True)
    report.load_end = machine.load_average()
    report.duration_s = time.monotonic() - started
    text = render(report)
    if output is not None:
        output.write_text(text)
        print(f"[bench] wrote {output} in {report.duration_s / 60:.1f} min", file=sys.stderr)
    else:
        print(text)
    return 0 if all(s.error is None for s in report.sections) else 1


if __name__ == "__main__":
    sys.exit(main())
