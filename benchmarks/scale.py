"""Scenario 12: scale. What a task costs the dispatcher as the schedule grows: more tasks
pending, more ordering ids, more partitions; and how fast several dispatchers release
together.

Each cost is the dispatcher's CPU per task (user and system time of its process and
children, divided by the tasks that ran) under scenario 3b's steady load, on a stack made
for the point measured:

- pending: that many tasks written straight into the schedule (as scenario 4 does), due one
  to eight days ahead, so none of them falls due during the run; the load runs beside them;
- ordering ids: the load's tasks spread over that many ordering ids;
- partitions: the topic and the leases at that many partitions, one dispatcher holding all.

Then scenario 8's ceiling (outcomes reported at once by a stand-in worker) with 1, 2 and 4
dispatcher processes started together.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from benchmarks.ceiling import ceiling
from benchmarks.context import Context, utc
from benchmarks.harness import Stack, log, stack
from benchmarks.lateness import WARM_UP_SEQ, WORKERS, Load, Outcome, measure
from benchmarks.populate import populate
from benchmarks.report import Section
from benchmarks.stats import Figure, ratio

__all__ = ["growth_by_run", "run"]

DAY = 86_400.0
CPU_GROWTH_TARGET = 0.20  # the bound, from the fewest pending to the most
BASE_IDS = 1000
BASE_PARTITIONS = 12


def growth_by_run(costs: Sequence[Sequence[float]]) -> list[float]:
    """*costs*: one list a point (the first is the base), one cost a run in each. Run by run,
    the largest cost among the later points over the base's, less one (a fraction; NaN where
    a cost is missing)."""
    return [ratio(max(point[k] for point in costs[1:]), costs[0][k]) - 1
            for k in range(len(costs[0]))]


def dispatcher_ms(outcome: Outcome) -> float:
    """The dispatcher's CPU ms per task that ran, over the run."""
    if outcome.cpu is None or not outcome.lateness:
        return float("nan")
    return outcome.cpu.ms_per_task(len(outcome.lateness)).get("dispatcher", float("nan"))


@contextmanager
def _ours(ctx: Context, *, partitions: int, ordering_ids: int, pending: int, fill_seconds: float
          ) -> Iterator[tuple[Stack, Callable[[int, float], None], Callable[[], None], int]]:
    """A stack with *pending* tasks far ahead, one dispatcher and the workers; how to publish
    the load's task (seq, due) over *ordering_ids*, a flush, and how many were written."""
    from celery_scheduler import flush

    with stack(ctx.tmp, partitions=partitions) as s:
        app = s.use_client()
        written = 0
        if pending:
            start = time.time() + DAY  # one to eight days ahead, rising with seq
            written, rate = populate(s, app, ((f"p{i % 100_000}", i, start + 7 * DAY * i / pending)
                                              for i in range(pending)), fill_seconds)
            log(f"12: {written:,} tasks pending written at {rate:,.0f}/s")
        s.dispatcher()
        for _ in range(WORKERS):
            s.worker()

        def publish(seq: int, due: float) -> None:
            app.record.schedule((f"o{seq % ordering_ids}", seq, due), {}, at=utc(due), wait=False)

        def flush_all() -> None:
            flush(app.app, 60)

        yield s, publish, flush_all, written


@dataclass
class Point:
    label: str
    costs: list[float]  # dispatcher CPU ms a task, one per run
    ran: list[float]  # share of the load's tasks run by the deadline, one per run


def _point(ctx: Context, label: str, load: Load, runs: int, **stack_options: int) -> Point:
    fill = ctx.pick(10, 900)
    with _ours(ctx, fill_seconds=fill, **stack_options) as (s, publish, flush, written):
        if stack_options.get("pending") and written < stack_options["pending"]:
            label += f" (only {written:,} written in {fill} s)"
        warm = Load(rate=load.rate, duration=ctx.pick(2, 10), lead=load.lead, grace=load.grace)
        measure(s, publish, flush, warm, WARM_UP_SEQ)
        outcomes = [measure(s, publish, flush, load, (k + 1) * 10_000_000) for k in range(runs)]
    point = Point(label, [dispatcher_ms(o) for o in outcomes], [o.ran for o in outcomes])
    log(f"12: {label}: dispatcher {Figure.of(point.costs, 'ms', 2)} a task")
    return point


def _dimension(section: Section, what: str, points: list[Point]) -> Figure:
    """A row per point; returns the growth from the first point, run by run."""
    for point in points:
        section.add(f"dispatcher CPU per task, {point.label}", Figure.of(point.costs, "ms", 2),
                    note="" if min(point.ran) >= 0.99 else
                    f"only {min(point.ran):.1%} of the load ran by the deadline in a run")
    grew = Figure.of(growth_by_run([point.costs for point in points]), "%", 1)
    log(f"12: {what}: growth {grew}")
    return grew


def run(ctx: Context) -> list[Section]:
    runs = ctx.pick(1, 3)
    load = Load(rate=100, duration=ctx.pick(3, 20), lead=ctx.pick(2, 5), grace=ctx.pick(6, 10))
    section = Section("12", "Scale: the dispatcher's cost as the schedule grows")
    pending = (1_000, 10_000) if ctx.quick else (10_000, 100_000, 1_000_000)
    by_pending = [_point(ctx, f"{n:,} tasks pending", load, runs, partitions=BASE_PARTITIONS,
                         ordering_ids=BASE_IDS, pending=n) for n in pending]
    grew = _dimension(section, "pending", by_pending)
    section.add(f"... growth from {pending[0]:,} to {pending[-1]:,} pending, run by run", grew,
                f"≤ {CPU_GROWTH_TARGET:.0%} in every run", grew.high <= CPU_GROWTH_TARGET)
    ids = (100, 10_000) if ctx.quick else (100, 10_000, 1_000_000)
    by_ids = [_point(ctx, f"the load over {n:,} ordering ids", load, runs,
                     partitions=BASE_PARTITIONS, ordering_ids=n, pending=0) for n in ids]
    grew = _dimension(section, "ordering ids", by_ids)
    section.add(f"... growth from {ids[0]:,} to {ids[-1]:,} ordering ids, run by run", grew)
    partitions = (12, 120) if ctx.quick else (12, 120, 1_200)
    by_partitions = [_point(ctx, f"{n:,} partitions", load, runs, partitions=n,
                            ordering_ids=BASE_IDS, pending=0) for n in partitions]
    grew = _dimension(section, "partitions", by_partitions)
    section.add(f"... growth from {partitions[0]:,} to {partitions[-1]:,} partitions, run by run",
                grew)
    tasks = ctx.pick(3_000, 100_000)
    window = ctx.pick(8, 40)
    for count in (1, 2) if ctx.quick else (1, 2, 4):
        drains = [ceiling(ctx, tasks, tasks // 10, window, ctx.pick(3, 60), count)
                  for _ in range(ctx.pick(1, 3))]
        section.add(f"{count} dispatcher(s): {tasks:,} overdue tasks released and reported, from "
                    f"launch", Figure.of([d.rate for d in drains], "tasks/s"))
    section.method = [
        f"scenario 3b's load ({load.rate:g} due tasks/s for {load.duration:g} s, published "
        f"{load.lead:g} s ahead, batched) on a stack of its own for each point, one dispatcher "
        f"and {WORKERS} solo workers, after an unmeasured run; {runs} run(s) a point on the same "
        f"processes. Unless the row says otherwise: {BASE_IDS:,} ordering ids, "
        f"{BASE_PARTITIONS} partitions, nothing else pending.",
        "pending: written straight into the schedule's tables (benchmarks.populate, the rows the "
        "store writes for a new task) over 100,000 ordering ids, due one to eight days ahead; "
        "10,000,000 is not run: at the rate this machine writes them (about 5,000 a second, "
        "scenario 2's raw batched writes; the log prints this run's), the fill alone would take "
        "over half an hour.",
        "growth, run by run: the largest cost among the later points over the first point's, "
        "in the same repetition.",
        "dispatchers: scenario 8 (a backlog of overdue tasks, a stand-in worker that reports each "
        "outcome at once) with that many dispatcher processes started together, sharing the "
        "partitions; the rate is over the time from their launch to the last task.",
    ]
    return [section]
