"""Scenario 3h: a hot ordering id, and what it does to the others.

One customer's 10,000 tasks fall due at once: their ordering id runs them one at a time, in
order, for minutes. Meanwhile every other ordering id must be as punctual as without it. The
steady load of 3b (100 due tasks a second over 1,000 ordering ids) is measured alone, then
again while the hot id's tasks, scheduled in one ``schedule_many`` call a few seconds before
the load, fall due together at its start.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator

from benchmarks.context import Context, utc
from benchmarks.harness import log
from benchmarks.lateness import WARM_UP_SEQ, Load, Outcome, measure, systems
from benchmarks.report import Section
from benchmarks.statements import requests_taken, table_counts
from benchmarks.stats import Figure, percentile, ratio

__all__ = ["run"]

HOT_ID = "hot"
HOT_FIRST_SEQ = 70_000_000  # clear of the load's seqs (lateness.measure counts only those)
FIRST_SECONDS = 5.0  # the window after the hot id falls due that its tail is looked at in


def _hot_order(seqs_in_start_order: list[int]) -> bool:
    return seqs_in_start_order == sorted(seqs_in_start_order)


@contextlib.contextmanager
def _counted(session: object, keyspace: str, into: list[dict[str, float]]) -> Iterator[None]:
    """Cassandra's requests, and the reads, writes and scans of each of *keyspace*'s tables,
    a second over the block (its own counters, as benchmarks.statements reads them)."""
    counts, requests = table_counts(session, keyspace), requests_taken(session)
    began = time.monotonic()
    yield
    seconds = time.monotonic() - began
    after = table_counts(session, keyspace)
    rates = {f"{kind}s of {table}": (after[(kind, table)] - counts.get((kind, table), 0)) / seconds
             for kind, table in after}
    rates["requests"] = (requests_taken(session) - requests) / seconds
    into.append(rates)


def _statement_rows(section: Section, statements: dict[str, list[dict[str, float]]]) -> None:
    """Cassandra's requests a second, and each table's reads, writes and scans a second that a
    hot id changed by more than 5 a second: where the store's added CPU goes."""
    def mean(runs: list[dict[str, float]], name: str) -> float:
        return sum(run.get(name, 0.0) for run in runs) / len(runs) if runs else 0.0

    alone, beside = statements["no hot id"], statements["with it"]
    names = sorted({name for run in alone + beside for name in run})
    shown = ["requests"] + [name for name in names if name != "requests"
                            and abs(mean(beside, name) - mean(alone, name)) > 5]
    for name in shown:
        for label, runs in (("no hot id", alone), ("with it", beside)):
            section.add(f"Cassandra {name} a second, {label}",
                        Figure.of([run.get(name, 0.0) for run in runs], "/s"))


def _where(section: Section, alone: list[Outcome], beside: list[Outcome],
           hot_due: list[float]) -> None:
    """Rows that say where the other ids' tail comes from: when it falls (while the hot id's
    tasks are first loaded, or later), which part it is spent in (the dispatcher, or the broker
    and the workers), and how busy the machine was."""
    def p99(values: list[float]) -> float:
        return percentile(values, 99) * 1000 if values else math.nan

    early = [[x for x, at in zip(o.lateness, o.due, strict=True) if at < due + FIRST_SECONDS]
             for o, due in zip(beside, hot_due, strict=True)]
    later = [[x for x, at in zip(o.lateness, o.due, strict=True) if at >= due + FIRST_SECONDS]
             for o, due in zip(beside, hot_due, strict=True)]
    section.add(f"other ids' lateness p99 with the hot id, tasks due in its first {FIRST_SECONDS:g} s",
                Figure.of([p99(x) for x in early], "ms", 1))
    section.add("... tasks due after those", Figure.of([p99(x) for x in later], "ms", 1))
    for name, outcomes in (("no hot id", alone), ("with it", beside)):
        section.add(f"other ids' due to published by the dispatcher p99, {name}",
                    Figure.of([p99(o.to_release) for o in outcomes], "ms", 1))
        section.add(f"other ids' published to started p99, {name}",
                    Figure.of([p99(o.after_release) for o in outcomes], "ms", 1))
        uses = [o.cpu for o in outcomes if o.cpu is not None]
        if uses and len(uses) == len(outcomes):
            section.add(f"machine busy over the run (both cores), {name}",
                        Figure.of([use.busy for use in uses], "%", 1))
            for part in sorted(uses[0].seconds):
                section.add(f"CPU share of one core, {part}, {name}", Figure.of(
                    [use.seconds.get(part, 0.0) / use.wall for use in uses], "%", 1))


def run(ctx: Context) -> list[Section]:
    hot_tasks = ctx.pick(1_000, 10_000)
    load = Load(rate=100, duration=ctx.pick(5, 30), lead=ctx.pick(2, 5), grace=ctx.pick(6, 15))
    warm = Load(rate=100, duration=ctx.pick(2, 10), lead=load.lead, grace=load.grace)
    runs = ctx.pick(1, 3)
    section = Section("3h", f"A hot ordering id: {hot_tasks:,} tasks of one id due at once")
    alone: list[Outcome] = []
    beside: list[Outcome] = []
    hot_started: list[int] = []
    hot_due: list[float] = []
    from benchmarks import app  # the stack's client is set on it

    statements: dict[str, list[dict[str, float]]] = {"no hot id": [], "with it": []}
    from cassandra.cluster import Cluster

    cluster = Cluster(["127.0.0.1"])
    session = cluster.connect()
    for k in range(runs):
        # a round on processes, a topic and a keyspace of its own: the hot id's tasks go on
        # running for minutes after its run, and would be a second hot id in the next one
        with systems(ctx, "celery_scheduler") as (s, publish, flush):
            measure(s, publish, flush, warm, WARM_UP_SEQ)
            with _counted(session, s.name, statements["no hot id"]):
                alone.append(measure(s, publish, flush, load, (k + 30) * 10_000_000))
            first = HOT_FIRST_SEQ + k * hot_tasks
            due = time.time() + load.lead + 1.0  # when the load's first tasks fall due
            hot_due.append(due)
            with _counted(session, s.name, statements["with it"]):
                app.record.schedule_many(  # type: ignore[attr-defined]  # the scheduled task
                    [(utc(due), (f"{HOT_ID}{k}", first + i, due)) for i in range(hot_tasks)])
                beside.append(measure(s, publish, flush, load, (k + 40) * 10_000_000))
            ran = sorted((x for x in s.starts() if x.ordering_id == f"{HOT_ID}{k}"),
                         key=lambda x: x.started)
            hot_started.append(len({x.seq for x in ran}))
            if not _hot_order([x.seq for x in ran]):
                raise RuntimeError(f"the hot id's tasks started out of order in run {k + 1}")
    p99_alone = Figure.of([o.ms(99) for o in alone], "ms", 1)
    p99_beside = Figure.of([o.ms(99) for o in beside], "ms", 1)
    ratios = Figure.of([ratio(b.ms(99), a.ms(99)) for a, b in zip(alone, beside, strict=True)],
                       "x", 1)
    section.add("other ids' lateness p99, no hot id", p99_alone)
    section.add("other ids' lateness p99, with the hot id due", p99_beside)
    section.add("... with / without, run by run", ratios, "≤ 2x in every run",
                ratios.high <= 2 if ratios.measured else None)
    section.add("other ids' tasks run by the deadline, with the hot id",
                Figure.of([o.ran for o in beside], "%", 1), "≥ 99% in every run",
                min(o.ran for o in beside) >= 0.99)
    seconds = load.duration + load.grace
    section.add(f"hot id: tasks started during the run (one at a time, in order; {seconds:g} s)",
                Figure.of(hot_started))
    section.add("other ids' lateness p50, no hot id / with it", Figure.of(
        [ratio(percentile(b.lateness, 50), percentile(a.lateness, 50))
         for a, b in zip(alone, beside, strict=True)], "x", 1))
    _where(section, alone, beside, hot_due)
    cluster.shutdown()
    _statement_rows(section, statements)
    log(f"3h: p99 {p99_alone} alone, {p99_beside} beside {hot_tasks} hot tasks")
    section.method = [
        f"the load of 3b ({load.rate:g} due tasks/s over 1,000 ordering ids for {load.duration:g} "
        f"s, published {load.lead:g} s ahead), one dispatcher and two solo workers; {runs} "
        "round(s), each on processes, a topic and a keyspace of its own: a warm-up, a run "
        f"alone, then a run with {hot_tasks:,} tasks of one new ordering id scheduled "
        "(schedule_many) just before and due when the load's first tasks are. Each round's "
        "hot id goes with its processes (its tasks run for minutes after its run), so every "
        "run with one has one; the ratio is taken round by round.",
        "the other ids' lateness as in 3 (first start minus due time); the hot id's tasks must "
        "start in order (the run fails otherwise), and how many started by the end of the run "
        "is shown: one at a time, each after the outcome of the one before.",
        "Cassandra's rows: requests a second from every client (system_views.clients), and "
        "the reads, writes and scans a second of each of the run's tables (system_views' "
        "local latency counters), over each run, the hot id's schedule_many included; a "
        "table's row is shown when the hot id moved it by more than 5 a second.",
    ]
    return [section]
