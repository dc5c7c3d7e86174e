"""``python -m benchmarks [--quick] [--only 1,3 [--update]] [--output FILE] | --render``: run
the scenarios, write the report.

A full run (every group, not ``--quick``) keeps each group's results in
``benchmarks/results/`` and writes BENCHMARKS.md. ``--only`` groups are printed, or, with
``--update``, kept in place of those groups' earlier results and BENCHMARKS.md written anew
from all of them (its Runs table then says which run each group comes from). ``--render`` runs nothing:
it writes BENCHMARKS.md from the kept results alone, each group with none kept shown as not
run (a full run stopped before its last groups, say).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import importlib.metadata
import math
import shlex
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from benchmarks import durability, machine, results, sizing
from benchmarks.context import Context
from benchmarks.harness import KAFKA, POSTGRES, REDIS_URL, REPO
from benchmarks.report import Report, Section, render, render_many

# scenario numbers → module with run(ctx) -> list[Section]; run in this order
SCENARIOS: dict[str, str] = {
    "1": "benchmarks.schedule",
    "1c": "benchmarks.spark_bulk",
    "2": "benchmarks.ingest",
    "3": "benchmarks.lateness",
    "3k": "benchmarks.delivery",
    "3h": "benchmarks.hot",
    "3c": "benchmarks.sweep",
    "4": "benchmarks.memory",
    "5": "benchmarks.failover",
    "6": "benchmarks.backlog",
    "8": "benchmarks.ceiling",
    "9": "benchmarks.duplicates",
    "10": "benchmarks.periodic",
    "11": "benchmarks.soak",
    "12": "benchmarks.scale",
}
PACKAGES = ("celery", "kombu", "confluent-kafka", "cassandra-driver", "redis", "rq", "procrastinate",
            "psycopg", "celery-longterm-scheduler", "celery-redbeat")


def _versions() -> dict[str, str]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "missing"
    return versions


def _durability() -> dict[str, str]:
    from benchmarks import app
    from celery_scheduler.config import get_settings

    settings = get_settings(app.app)
    return durability.describe(
        kafka_bootstrap=KAFKA, replication=settings.kafka_replication_factor,
        cassandra_host=settings.cassandra_contact_points[0], cassandra_port=settings.cassandra_port,
        cassandra_replication=str(dict(settings.cassandra_replication)),
        consistency=settings.cassandra_consistency, serial=settings.cassandra_serial_consistency,
        redis_url=REDIS_URL, postgres_conninfo=f"{POSTGRES}/postgres")


def _scenario(number: str) -> Callable[[Context], list[Section]]:
    module = importlib.import_module(SCENARIOS[number])
    run: Callable[[Context], list[Section]] = module.run
    return run


def not_run(reports: list[Report], order: list[str]) -> list[Report]:
    """A report for each group of *order* that *reports* lack, saying it was not run, with
    the newest report's run (so that it reads as part of that run)."""
    kept = {next(iter(r.probes)) for r in reports if r.probes}
    newest = max(reports, key=lambda r: r.started)
    return [dataclasses.replace(
        newest, probes={number: math.nan},
        sections=[Section(number, SCENARIOS[number].rsplit(".", 1)[-1],
                          error=f"not run: no result of this group is kept (scripts/bench "
                                f"--only {number} --update runs it and adds it here)")])
        for number in order if number not in kept]


def _render(output: Path) -> int:
    reports = results.load()
    if not reports:
        print("no kept results: run scripts/bench (full) first", file=sys.stderr)
        return 1
    missing = not_run(reports, list(SCENARIOS))
    output.write_text(render_many(reports + missing, list(SCENARIOS), sizing.derived))
    print(f"[bench] wrote {output} from the kept results"
          + (f"; not run: {', '.join(next(iter(r.probes)) for r in missing)}" if missing else ""),
          file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller counts, fewer runs (< 5 min)")
    parser.add_argument("--only", default="", help="comma-separated scenario groups, e.g. 1,3")
    parser.add_argument("--runs", type=int, default=None, help="repetitions of the short scenarios")
    parser.add_argument("--output", type=Path, default=None,
                        help="report file (default BENCHMARKS.md; a partial run only prints)")
    parser.add_argument("--update", action="store_true",
                        help="with --only: keep these groups' results in place of the earlier "
                             "ones and write BENCHMARKS.md from all of them")
    parser.add_argument("--render", action="store_true",
                        help="run nothing: write BENCHMARKS.md from the kept results, a group "
                             "with none shown as not run")
    parser.add_argument("--command", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.render:
        if args.only or args.update or args.quick:
            parser.error("--render runs nothing: not with --only, --update or --quick")
        return _render(args.output or REPO / "BENCHMARKS.md")
    chosen = [n.strip() for n in args.only.split(",") if n.strip()] or list(SCENARIOS)
    unknown = [n for n in chosen if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario group(s) {unknown}; known: {', '.join(SCENARIOS)}")
    if args.update and (args.quick or args.output):
        parser.error("--update keeps full runs' results in BENCHMARKS.md: not with --quick or "
                     "--output")
    if args.update and not results.load():
        parser.error("no kept results to write BENCHMARKS.md with: run scripts/bench (full) once "
                     "first")
    # only full runs reach BENCHMARKS.md: a quick or partial one prints (or goes to --output)
    keep = args.update or (chosen == list(SCENARIOS) and not args.quick and args.output is None)
    output = args.output or (REPO / "BENCHMARKS.md" if keep else None)
    command = args.command or "python -m benchmarks " + shlex.join(sys.argv[1:] if argv is None else argv)
    started = time.monotonic()
    report = Report(command=command.strip(), mode="quick" if args.quick else "full",
                    started=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                    machine=machine.describe(), load_start=machine.load_average(),
                    versions=_versions(), durability=_durability(),
                    code=results.code_version(REPO))
    groups: dict[str, list[Section]] = {}
    runs = args.runs or (2 if args.quick else 5)
    with tempfile.TemporaryDirectory(prefix="celery-scheduler-bench-") as tmp:
        ctx = Context(quick=args.quick, tmp=Path(tmp), runs=runs)
        for number in chosen:
            report.probes[number] = machine.speed_probe()
            print(f"[bench] scenario {number} ({SCENARIOS[number]}) at load {machine.load_average()}, "
                  f"speed probe {report.probes[number]:.1f} ms", file=sys.stderr, flush=True)
            began = time.monotonic()
            try:
                groups[number] = _scenario(number)(ctx)
            except Exception as exc:
                traceback.print_exc()
                groups[number] = [Section(number, SCENARIOS[number].rsplit(".", 1)[-1],
                                          error=f"{type(exc).__name__}: {exc}"[:1000])]
            report.sections += groups[number]
            if keep:  # kept as each group ends: a run cut short keeps what it measured
                results.save(report, {number: groups[number]})
            print(f"[bench] scenario {number} took {time.monotonic() - began:.0f}s", file=sys.stderr,
                  flush=True)
    report.load_end = machine.load_average()
    report.duration_s = time.monotonic() - started
    if keep:  # a group no run has kept is shown as not run, as --render shows it
        results.save(report, groups)
        kept = results.load()
        text = render_many(kept + not_run(kept, list(SCENARIOS)), list(SCENARIOS), sizing.derived)
    else:
        text = render(report, sizing.derived)
    if output is not None:
        output.write_text(text)
        print(f"[bench] wrote {output} in {report.duration_s / 60:.1f} min", file=sys.stderr)
    else:
        print(text)
    return 0 if all(s.error is None for s in report.sections) else 1


if __name__ == "__main__":
    sys.exit(main())
