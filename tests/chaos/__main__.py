"""``scripts/chaos``: run the chaos harness and print (or write) the reliability report.

    scripts/chaos --quick                      # ~4 minutes, one fault of every kind
    scripts/chaos --long                       # 130,000 tasks, 30 faults of every kind;
                                               # writes RELIABILITY.md
    scripts/chaos --long --broker rabbitmq     # writes docs/reliability-rabbitmq.md
    scripts/chaos --quick --mutant commit-before-persist   # must report lost tasks (and so
                                               # on: each of tests.apps.chaos.MUTANTS breaks one)
    scripts/chaos --quick --broker rabbitmq    # Celery on RabbitMQ, with RabbitMQ restarts
    scripts/chaos --quick --cluster            # three Kafka brokers, three Cassandra nodes,
                                               # with node kills and stalls (~10 minutes)
    scripts/chaos --long --cluster             # 115,000 tasks, 20 faults of 9 kinds; writes
                                               # docs/reliability-cluster.md

Exit status 0 when no guarantee was broken, 1 otherwise, 2 when the run could not be made.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from collections import Counter
from dataclasses import replace
from pathlib import Path

from tests.apps.chaos import MUTANTS
from tests.chaos.harness import (
    PERIODIC_ENTRIES,
    SERVICE_FAULTS,
    ChaosLockBusy,
    Options,
    Run,
    RunFacts,
    chaos_lock,
    fault_kinds,
    load_facts,
    save_facts,
    state_root,
)
from tests.chaos.report import render
from tests.chaos.verify import verify
from tests.services import REPO

# Scheduling goes on for 45 s: one fault of each kind takes about 35 s on the longest lane
# here (a Cassandra restart about 14 s, a replaced dispatcher leases after about 13 s), well
# short of the span EXPECTED_SECONDS plans for a loaded machine.
QUICK = Options(tasks=1200, ordering_ids=60, faults_per_kind=1, gap=(2.0, 4.0), drain_seconds=90.0,
                produce_seconds=45.0, periodic=PERIODIC_ENTRIES, pause_gap=10.0, pause_ids=3,
                reschedule_gap=3.0, reschedule_ids=5, hot_bursts=2, hot_size=100)
# What the long run must reach to count as one: accepted tasks and faults of each kind.
TARGET_TASKS, TARGET_FAULTS = 100_000, 30
TARGET_CLUSTER_FAULTS = 20  # a cluster run's, of each of its nine kinds
# 130,000 planned so that more than 100,000 are accepted: calls made while Kafka restarts
# fail (about a fifth of them). Four workers, since a tenth of the tasks sleep up to 0.5 s.
# The lanes span 70 minutes. Spread over 45, Cassandra restarted about once a minute and was
# down for 40% of the run: on two cores, with every service beside the scheduler, the
# restarts' CPU alone left too little to run the backlog down, whatever the code.
LONG = Options(tasks=130_000, ordering_ids=2000, faults_per_kind=30, window=4200.0,
               drain_seconds=1200.0, workers=4, periodic=PERIODIC_ENTRIES, pause_gap=30.0,
               pause_ids=20, reschedule_gap=5.0, reschedule_ids=10, hot_bursts=20, hot_size=300)
# The cluster's: six JVMs share the two cores with everything else, so fewer tasks; 5,000 of
# them due 30-60 minutes after they were scheduled, read from far buckets across faults.
QUICK_CLUSTER = replace(QUICK, cluster=True, far_tasks=60, far_delay=(60.0, 120.0),
                        drain_seconds=150.0, produce_seconds=None)
LONG_CLUSTER = replace(LONG, cluster=True, tasks=115_000, faults_per_kind=20, far_tasks=5000)


def parse(argv: list[str]) -> tuple[Options, argparse.Namespace]:
    parser = argparse.ArgumentParser(prog="scripts/chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parser.add_mutually_exclusive_group(required=True)
    size.add_argument("--quick", action="store_true", help="the short run the test suite makes")
    size.add_argument("--long", action="store_true", help="the long run behind RELIABILITY.md")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tasks", type=int)
    parser.add_argument("--ordering-ids", type=int)
    parser.add_argument("--faults-per-kind", type=int)
    parser.add_argument("--window", type=float, help="seconds each fault lane is spread over")
    parser.add_argument("--drain-seconds", type=float,
                        help="how long to wait after the last due time for the last runs")
    parser.add_argument("--dispatchers", type=int, help="dispatcher processes (default 2)")
    parser.add_argument("--workers", type=int, help="Celery worker processes (default 2)")
    parser.add_argument("--cluster", action="store_true",
                        help="three Kafka brokers and three Cassandra nodes (RF 3, LOCAL_QUORUM), "
                             "with node kills and stalls")
    parser.add_argument("--broker", choices=["redis", "rabbitmq"], default="redis",
                        help="the Celery broker the workers use, and restart (default redis)")
    parser.add_argument("--kinds", help="comma-separated fault kinds (default all of the broker's: "
                                        f"{','.join(fault_kinds('redis'))})")
    parser.add_argument("--mutant", choices=sorted(MUTANTS),
                        help="run a deliberately broken dispatcher (each breaks one guarantee)")
    parser.add_argument("--report", type=Path, help="write the Markdown report here "
                        "(--long: RELIABILITY.md unless given)")
    parser.add_argument("--run-dir", type=Path, help="logs and facts (default: a new temp dir)")
    parser.add_argument("--from-facts", type=Path, metavar="FACTS_JSON", action="append",
                        help="no new run: verify and report the facts runs saved (repeat it: "
                             "the first is the main report, the others follow as checks)")
    args = parser.parse_args(argv)
    options = (QUICK_CLUSTER if args.cluster else QUICK) if args.quick else (
        LONG_CLUSTER if args.cluster else LONG)
    changes: dict[str, object] = {"seed": args.seed, "mutant": args.mutant, "broker": args.broker,
                                  "kinds": fault_kinds(args.broker, args.cluster)}
    for name in ("tasks", "ordering_ids", "faults_per_kind", "window", "drain_seconds",
                 "dispatchers", "workers"):
        if getattr(args, name) is not None:
            changes[name] = getattr(args, name)
    if args.kinds:
        kinds = tuple(args.kinds.split(","))
        known = fault_kinds(args.broker, args.cluster)
        unknown = set(kinds) - set(known)
        if unknown:
            other = " (a restart of a service this broker's run does not use)" if (
                unknown & set(SERVICE_FAULTS)) else ""
            parser.error(f"unknown fault kinds {sorted(unknown)}{other}; known: {', '.join(known)}")
        changes["kinds"] = kinds
    if args.long and args.report is None:  # the long run of each broker has its page
        args.report = REPO / ("docs/reliability-cluster.md" if args.cluster else
                              "RELIABILITY.md" if args.broker == "redis"
                              else f"docs/reliability-{args.broker}.md")
    return replace(options, **changes), args  # type: ignore[arg-type]


def main(argv: list[str]) -> int:
    options, args = parse(argv)
    if args.from_facts:
        return report(*[load_facts(path) for path in args.from_facts], path=args.report)
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="celery-scheduler-chaos-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    if (run_dir / "executions.jsonl").exists():
        # the verdict reads that log: an earlier run's executions would count as this one's
        print(f"chaos: {run_dir} holds an earlier run's executions.jsonl; give an empty or "
              "new --run-dir", file=sys.stderr)
        return 2
    print(f"== chaos run: {options}\n== logs in {run_dir}", flush=True)
    root = state_root()
    try:
        with chaos_lock(root):
            run = Run(options, run_dir, root / "services")
            try:
                facts = run.execute()
            finally:
                run.services.run("down")
    except ChaosLockBusy as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return 2
    save_facts(facts, run_dir / "facts.json")
    return report(facts, path=args.report)


def command_of(options: Options) -> str:
    """The command that repeats a run with *options* (the report names it)."""
    long = options.ordering_ids == LONG.ordering_ids
    preset = ((LONG_CLUSTER if long else QUICK_CLUSTER) if options.cluster
              else (LONG if long else QUICK))
    argv = ["--long" if long else "--quick", *(["--cluster"] if options.cluster else []),
            "--seed", str(options.seed)]
    for name in ("tasks", "ordering_ids", "faults_per_kind", "window", "drain_seconds",
                 "dispatchers", "workers"):
        if getattr(options, name) != getattr(preset, name):
            argv += [f"--{name.replace('_', '-')}", f"{getattr(options, name):g}"]
    if options.broker != "redis":
        argv += ["--broker", options.broker]
    if options.kinds != fault_kinds(options.broker, options.cluster):
        argv += ["--kinds", ",".join(options.kinds)]
    if options.mutant:
        argv += ["--mutant", options.mutant]
    return "scripts/chaos " + shlex.join(argv)


def report(facts: RunFacts, *checks: RunFacts, path: Path | None) -> int:
    """Print (and write) the report of *facts*, then of each further run as a check."""
    verdict = verify(facts)
    o = facts.options
    note = ""
    kinds = Counter(f.kind for f in facts.faults)
    fewest = min(kinds.get(kind, 0) for kind in o.kinds)
    accepted = verdict.counts["accepted"]
    target_faults = TARGET_CLUSTER_FAULTS if o.cluster else TARGET_FAULTS
    if not o.mutant and o.window and (accepted < TARGET_TASKS or fewest < target_faults):
        note = (f"**This run is smaller than the long run's target** (at least {TARGET_TASKS:,} "
                f"accepted tasks and {target_faults} faults of each kind): {accepted:,} tasks were "
                f"accepted and the least frequent fault kind was injected {fewest} times.")
    parts = [render(facts, verdict, command_of(facts.options), note=note)]
    for check in checks:
        title = (f"Mutant check: {check.options.mutant}" if check.options.mutant
                 else "Cluster run" if check.options.cluster
                 else "Single-node run" if o.cluster else "Further run")
        parts.append(render(check, verify(check), command_of(check.options), title, rules=False))
    text = "\n".join(parts)
    print(text)
    if path:
        path.write_text(text)
        print(f"== report written to {path}")
    print(f"== {'PASS' if verdict.ok else 'FAIL'}", flush=True)
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
