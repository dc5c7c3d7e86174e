"""Scenarios 6 and 7: a backlog of overdue tasks after a restart, and what ordering costs.

The backlog is written straight into the scheduler's tables (``benchmarks.populate``) while
no dispatcher runs, all due within a few seconds; once every task is overdue, two workers
and then one dispatcher start. "Drained" means executed: a task counts when its body
started (execution log), which is later than its release. The drain rate is tasks started
/ time from the first start to the last, over a bounded window.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from benchmarks.context import Context
from benchmarks.cpu import CpuMeter, CpuUse, add_rows, local_services
from benchmarks.failover import first_starts
from benchmarks.harness import Stack, stack
from benchmarks.populate import populate
from benchmarks.report import Section
from benchmarks.stats import Figure

__all__ = ["Drain", "drain", "run"]

WORKERS = 2


@dataclass(frozen=True)
class Drain:
    tasks: int  # in the backlog
    started: int  # distinct tasks started within the window
    rate: float  # tasks started / (last start - first start)
    first_after: float  # seconds from the dispatcher's start to the first task start
    out_of_order: int  # ordering ids whose tasks did not start in schedule order
    fill_rate: float
    cpu: CpuUse  # from the first start to the end of the wait
    cpu_tasks: int  # task bodies started while *cpu* was measured


def drain(ctx: Context, tasks: int, ordering_ids: int, window: float, fill_seconds: float) -> Drain:
    """Fill a backlog of *tasks* over *ordering_ids* (seq order = schedule order per id), drain it."""
    with stack(ctx.tmp) as s:
        app = s.use_client()
        base = time.time() + ctx.pick(1, 5)
        spacing = 2e-4  # 5,000 due per second of schedule time
        tasks, fill_rate = populate(s, app, ((f"o{i % ordering_ids}", i, base + i * spacing)
                                             for i in range(tasks)), fill_seconds)
        time.sleep(max(0.0, base + tasks * spacing + 1 - time.time()))
        workers = [s.worker() for _ in range(WORKERS)]
        launched = time.time()
        dispatcher = s.dispatcher(wait=False)
        return _measure(s, tasks, window, launched, fill_rate,
                        {"dispatcher": [dispatcher.pid], "workers": [w.pid for w in workers]})


def celery_drain(ctx: Context, tasks: int, ordering_ids: int, window: float) -> Drain:
    """The floor: the same task bodies as plain Celery messages already queued, then drained.

    No scheduler at all: what Celery's workers alone execute on this machine bounds any
    scheduler that releases to them.
    """
    with stack(ctx.tmp, init=False) as s:
        app = s.use_client()
        now = time.time()
        started = time.monotonic()
        for i in range(tasks):
            app.plain.apply_async((f"o{i % ordering_ids}", i, now), queue=s.name)
        fill_rate = tasks / (time.monotonic() - started)
        launched = time.time()
        workers = [s.worker(wait=False) for _ in range(WORKERS)]
        return _measure(s, tasks, window, launched, fill_rate, {"workers": [w.pid for w in workers]})


def _measure(s: Stack, tasks: int, window: float, launched: float, fill_rate: float,
             processes: dict[str, list[int]]) -> Drain:
    # CPU is counted from the first start on, so the processes' start-up is left out
    meter = CpuMeter({**processes, **local_services()})
    s.wait_for_starts(1, timeout=window)
    counted_from = len(s.starts())
    meter.start()
    s.wait_for_starts(tasks, timeout=window - (time.time() - launched))
    cpu = meter.stop()
    starts = s.starts()
    first = first_starts(starts)
    times = sorted(x.started for x in first.values())
    rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else 0.0
    by_id: dict[str, list[tuple[float, int]]] = {}
    for x in first.values():
        by_id.setdefault(x.ordering_id, []).append((x.started, x.seq))
    out_of_order = sum(1 for runs in by_id.values()
                       if [seq for _, seq in sorted(runs)] != sorted(seq for _, seq in runs))
    return Drain(tasks, len(first), rate, (times[0] - launched) if times else float("nan"),
                 out_of_order, fill_rate, cpu, len(starts) - counted_from)


def _rows(section: Section, label: str, drains: list[Drain]) -> Figure:
    rate = Figure.of([d.rate for d in drains], "tasks/s")
    section.add(f"{label}: drain rate (executed)", rate)
    section.add(f"{label}: tasks started within the window",
                Figure.of([d.started / d.tasks for d in drains], "%", 1))
    section.add(f"{label}: first task started after launch (dispatcher, or workers alone)",
                Figure.of([d.first_after for d in drains], "s", 1))
    return rate


def run(ctx: Context) -> list[Section]:
    runs = 1
    window = ctx.pick(8, 30)
    six = Section("6", "Backlog of overdue tasks after a restart")
    backlog_tasks = ctx.pick(3_000, 100_000)
    drains = [drain(ctx, backlog_tasks, backlog_tasks // 10, window, ctx.pick(3, 60))
              for _ in range(runs)]
    rate = _rows(six, f"{drains[0].tasks:,} tasks, {backlog_tasks // 10:,} ordering ids x 10", drains)
    six.rows[0].target, six.rows[0].met = "≥ 5,000 tasks/s", rate.median >= 5000
    order = Figure.of([d.out_of_order for d in drains])
    six.add("ordering ids whose tasks started out of order", order, "0", order.median == 0)
    add_rows(six, "celery_scheduler", [d.cpu for d in drains], [d.cpu_tasks for d in drains])
    floor = [celery_drain(ctx, backlog_tasks, backlog_tasks // 10, window) for _ in range(runs)]
    _rows(six, f"Celery alone, {backlog_tasks:,} queued plain tasks", floor)
    six.add("celery_scheduler / Celery alone", Figure.of(
        [d.rate / f.rate if f.rate else float("nan") for d, f in zip(drains, floor, strict=True)], "%"))
    add_rows(six, "Celery alone", [d.cpu for d in floor], [d.cpu_tasks for d in floor])
    six.method = [
        f"backlog of up to {backlog_tasks:,} tasks (filling stops after {ctx.pick(3, 60)} s; the "
        "figure names the count reached), due 5,000 per second of schedule time, written straight "
        "into the scheduler's tables with no dispatcher running; once all are overdue, "
        f"{WORKERS} solo workers and one dispatcher start. Drained = executed (the task body "
        f"started). Waiting stops after {window} s; the rate counts what started by then.",
        "order: for each ordering id, its tasks' first starts sorted by time must follow their "
        "schedule order.",
        f"Celery alone (the floor): the same number of plain Celery tasks with the same body, "
        f"queued with apply_async before {WORKERS} solo workers start; no scheduler involved, "
        "so no scheduler that releases to Celery workers can drain faster on this machine.",
        "CPU: user + system CPU time of each part (dispatcher, workers, and the Kafka, Cassandra "
        "and Redis processes) from the first task start to the end of the wait, divided by the "
        "task bodies started meanwhile; machine busy = share of all cores not idle (whatever "
        "runs, this run or not). Near 100% busy, CPU is the limit and these rows say who spends it.",
    ]
    seven = Section("7", "Ordering overhead: many tasks per ordering id vs unique ordering ids")
    per_id_tasks = ctx.pick(1_000, 100_000)
    ids = ctx.pick(20, 1000)
    chained = [drain(ctx, per_id_tasks, ids, window, ctx.pick(3, 40)) for _ in range(runs)]
    unique = [drain(ctx, per_id_tasks, per_id_tasks, window, ctx.pick(3, 40)) for _ in range(runs)]
    _rows(seven, f"{ids:,} ordering ids x {per_id_tasks // ids}", chained)
    _rows(seven, "unique ordering ids", unique)
    seven.add("throughput with ordering / without",
              Figure.of([c.rate / u.rate if u.rate else float("nan") for c, u in zip(chained, unique,
                                                                                     strict=True)], "%"))
    seven.add("ordering ids whose tasks started out of order",
              Figure.of([d.out_of_order for d in chained]))
    seven.method = [
        f"the same backlog procedure as 6, up to {per_id_tasks:,} tasks each (filling stops after "
        f"{ctx.pick(3, 40)} s): {ids:,} ordering ids with {per_id_tasks // ids} tasks each "
        "(each runs only after the previous one of its id completed), then every task on its own "
        "ordering id.",
        f"{runs} run of each per mode: a backlog is costly to fill on this shared machine.",
    ]
    return [six, seven]
