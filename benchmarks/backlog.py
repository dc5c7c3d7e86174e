"""Scenarios 6 and 7: a backlog of overdue tasks after a restart, and what ordering costs.

The backlog is written straight into the scheduler's tables (``benchmarks.populate``) while
no dispatcher runs, all due within a few seconds; once every task is overdue, two workers
and then one dispatcher start. "Drained" means executed: a task counts when its body
started (execution log), which is later than its release. The drain rate is tasks started
/ time from the launch (of the dispatcher, or of the workers alone) to the last start, over a
bounded window: start-up counts, as it does for a user waiting for the backlog; the rate
from the first start to the last is shown beside it.

The peers get the same backlog through their own APIs: procrastinate's jobs (locked by
ordering id) inserted in batches while no worker runs, celery-longterm-scheduler's stored
calls while its command does not run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice

from benchmarks import peers_longterm
from benchmarks.context import Context
from benchmarks.cpu import CpuMeter, CpuUse, add_cost_targets, add_rows, local_services
from benchmarks.failover import first_starts
from benchmarks.harness import RABBITMQ_URL, Stack, stack
from benchmarks.populate import populate
from benchmarks.report import Section
from benchmarks.stats import Figure, ratio

__all__ = ["Drain", "drain", "measure_drain", "run"]

WORKERS = 2
SPACING = 2e-4  # seconds of schedule time between two backlog tasks: 5,000 due per second
RUNS = 3  # rounds of every system in turn (full runs)
PROCRASTINATE = "procrastinate"
# procrastinate with synchronous_commit off: durability like ours (a crash may lose the last
# commits, as Cassandra's periodic commit log may lose the last writes)
PROCRASTINATE_ASYNC = "procrastinate, synchronous_commit off"
LONGTERM = "celery-longterm-scheduler"


@dataclass(frozen=True)
class Drain:
    tasks: int  # in the backlog
    started: int  # distinct tasks started within the window
    rate: float  # tasks started / (last start - launch)
    steady_rate: float  # tasks started / (last start - first start)
    first_after: float  # seconds from the dispatcher's start to the first task start
    out_of_order: int  # ordering ids whose tasks did not start in schedule order
    fill_rate: float
    cpu: CpuUse  # from the first start to the end of the wait
    cpu_tasks: int  # task bodies started while *cpu* was measured


def drain(ctx: Context, tasks: int, ordering_ids: int, window: float, fill_seconds: float,
          broker: str | None = None) -> Drain:
    """Fill a backlog of *tasks* over *ordering_ids* (seq order = schedule order per id), drain it
    (released to the Celery *broker*; None: Redis)."""
    with stack(ctx.tmp, broker=broker) as s:
        app = s.use_client()
        base = time.time() + ctx.pick(1, 5)
        tasks, fill_rate = populate(s, app, _backlog(tasks, ordering_ids, base), fill_seconds)
        time.sleep(max(0.0, base + tasks * SPACING + 1 - time.time()))
        workers = [s.worker() for _ in range(WORKERS)]
        launched = time.time()
        dispatcher = s.dispatcher(wait=False)
        return measure_drain(s, tasks, window, launched, fill_rate,
                        {"dispatcher": [dispatcher.pid], "workers": [w.pid for w in workers]})


def _backlog(tasks: int, ordering_ids: int, base: float) -> Iterator[tuple[str, int, float]]:
    """(ordering id, seq, due) of the backlog's tasks: seq order is schedule order per id."""
    return ((f"o{i % ordering_ids}", i, base + i * SPACING) for i in range(tasks))


def fill(tasks: Iterable[tuple[str, int, float]], store: Callable[[list[tuple[str, int, float]]], None],
         seconds: float, batch: int = 1000) -> tuple[int, float]:
    """Hand *tasks* to *store* a batch at a time, stopping after about *seconds*; (stored, per s)."""
    started = time.perf_counter()
    stored = 0
    iterator = iter(tasks)
    while time.perf_counter() - started < seconds:
        chunk = list(islice(iterator, batch))
        if not chunk:
            break
        store(chunk)
        stored += len(chunk)
    return stored, stored / max(time.perf_counter() - started, 1e-9)


def peer_drain(ctx: Context, peer: str, tasks: int, ordering_ids: int, window: float,
               fill_seconds: float) -> Drain:
    """The same backlog through a peer's own API, stored while nothing runs it, then drained.

    procrastinate: jobs locked by ordering id, inserted in batches of 1,000 (its batch defer);
    the workers start once every job is overdue. celery-longterm-scheduler: calls stored with
    apply_async(eta=...); two Celery workers, then its command start once all are overdue.
    """
    with stack(ctx.tmp, init=False) as s:
        base = time.time() + ctx.pick(1, 5)
        if peer in (PROCRASTINATE, PROCRASTINATE_ASYNC):
            from benchmarks import peers_procrastinate  # its driver is in the bench extra only

            with peers_procrastinate.database(s, synchronous_commit=peer == PROCRASTINATE):
                deferrer = peers_procrastinate.Deferrer(s.name)
                try:
                    count, rate = fill(_backlog(tasks, ordering_ids, base),
                                       lambda jobs: deferrer.defer_many(jobs, lock=True), fill_seconds)
                    deferrer.analyze()
                finally:
                    deferrer.close()
                time.sleep(max(0.0, base + count * SPACING + 1 - time.time()))
                launched = time.time()
                workers = [peers_procrastinate.worker(s, wait=False) for _ in range(WORKERS)]
                return measure_drain(s, count, window, launched, rate, {"workers": [w.pid for w in workers]})
        app = s.use_client()

        def store(chunk: list[tuple[str, int, float]]) -> None:
            for ordering_id, seq, due in chunk:
                peers_longterm.schedule(app, s, ordering_id, seq, due)

        try:
            count, rate = fill(_backlog(tasks, ordering_ids, base), store, fill_seconds)
            time.sleep(max(0.0, base + count * SPACING + 1 - time.time()))
            workers = [s.worker(plain=True) for _ in range(WORKERS)]
            launched = time.time()
            command = peers_longterm.ticker(s)
            return measure_drain(s, count, window, launched, rate,
                                 {peers_longterm.PART: [command.pid], "workers": [w.pid for w in workers]})
        finally:
            peers_longterm.clean(s.name)


def celery_drain(ctx: Context, tasks: int, ordering_ids: int, window: float,
                 broker: str | None = None) -> Drain:
    """The floor: the same task bodies as plain Celery messages already queued, then drained.

    No scheduler at all: what Celery's workers alone execute on this machine bounds any
    scheduler that releases to them.
    """
    with stack(ctx.tmp, init=False, broker=broker) as s:
        app = s.use_client()
        now = time.time()
        started = time.monotonic()
        with app.app.connection_for_write(broker) as connection:
            for i in range(tasks):
                app.plain.apply_async((f"o{i % ordering_ids}", i, now), queue=s.name,
                                      connection=connection)
        fill_rate = tasks / (time.monotonic() - started)
        launched = time.time()
        workers = [s.worker(wait=False, plain=True) for _ in range(WORKERS)]
        return measure_drain(s, tasks, window, launched, fill_rate, {"workers": [w.pid for w in workers]})


def measure_drain(s: Stack, tasks: int, window: float, launched: float, fill_rate: float,
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
    steady = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else 0.0
    rate = len(times) / (times[-1] - launched) if times and times[-1] > launched else 0.0
    by_id: dict[str, list[tuple[float, int]]] = {}
    for x in first.values():
        by_id.setdefault(x.ordering_id, []).append((x.started, x.seq))
    out_of_order = sum(1 for runs in by_id.values()
                       if [seq for _, seq in sorted(runs)] != sorted(seq for _, seq in runs))
    return Drain(tasks, len(first), rate, steady, (times[0] - launched) if times else float("nan"),
                 out_of_order, fill_rate, cpu, len(starts) - counted_from)


def _rows(section: Section, label: str, drains: list[Drain]) -> Figure:
    rate = Figure.of([d.rate for d in drains], "tasks/s")
    section.add(f"{label}: drain rate (executed), from launch", rate)
    section.add(f"{label}: drain rate, first start to last",
                Figure.of([d.steady_rate for d in drains], "tasks/s"))
    section.add(f"{label}: tasks started within the window",
                Figure.of([d.started / d.tasks for d in drains], "%", 1))
    section.add(f"{label}: first task started after launch (dispatcher, or workers alone)",
                Figure.of([d.first_after for d in drains], "s", 1))
    return rate


def _peer_rows(section: Section, peer: str, drains: list[Drain], ours: list[Drain], what: str,
               ordered: bool) -> None:
    """A peer's drain rows, its order check, our rate over its, and where its CPU went."""
    _rows(section, f"{peer}, {what}", drains)
    note = "" if ordered else " (it has no ordering: shown for what that means)"
    section.add(f"{peer}: ordering ids whose tasks started out of order{note}",
                Figure.of([d.out_of_order for d in drains]))
    section.add(f"celery_scheduler / {peer}: drain rate",
                Figure.of([ratio(a.rate, b.rate) for a, b in zip(ours, drains, strict=False)], "%"))
    add_rows(section, peer, [d.cpu for d in drains], [d.cpu_tasks for d in drains])


def _six(ctx: Context, runs: int, window: int) -> Section:
    six = Section("6", "Backlog of overdue tasks after a restart")
    backlog_tasks, fill_seconds = ctx.pick(3_000, 100_000), ctx.pick(3, 60)
    ids = backlog_tasks // 10
    # The machine's speed drifts within minutes: every system drains in turn, a round at a
    # time (A B A B), and each ratio is taken round by round, then its median.
    drains: list[Drain] = []
    floor: list[Drain] = []
    rabbit: list[Drain] = []
    rabbit_floor: list[Drain] = []
    peers: dict[str, list[Drain]] = {peer: [] for peer in (PROCRASTINATE, PROCRASTINATE_ASYNC,
                                                            LONGTERM)}
    for _ in range(runs):
        drains.append(drain(ctx, backlog_tasks, ids, window, fill_seconds))
        floor.append(celery_drain(ctx, backlog_tasks, ids, window))
        rabbit.append(drain(ctx, backlog_tasks, ids, window, fill_seconds, RABBITMQ_URL))
        rabbit_floor.append(celery_drain(ctx, backlog_tasks, ids, window, RABBITMQ_URL))
        for peer, drained in peers.items():
            drained.append(peer_drain(ctx, peer, backlog_tasks, ids, window, fill_seconds))
    rate = _rows(six, f"{drains[0].tasks:,} tasks, {ids:,} ordering ids x 10", drains)
    six.rows[0].target, six.rows[0].met = "≥ 5,000 tasks/s in every run", rate.low >= 5000
    order = Figure.of([d.out_of_order for d in drains])
    six.add("ordering ids whose tasks started out of order", order, "0 in every run",
            order.high == 0)
    cost_rows = add_rows(six, "celery_scheduler", [d.cpu for d in drains], [d.cpu_tasks for d in drains])
    _rows(six, f"Celery alone, {backlog_tasks:,} queued plain tasks", floor)
    share = Figure.of(
        [d.rate / f.rate if f.rate else float("nan") for d, f in zip(drains, floor, strict=True)], "%")
    six.add("celery_scheduler / Celery alone, from launch", share, "≥ 80% in every run",
            share.low >= 0.8)
    add_rows(six, "Celery alone", [d.cpu for d in floor], [d.cpu_tasks for d in floor])
    add_cost_targets(six, cost_rows, [(d.cpu, d.cpu_tasks) for d in drains],
                     [(f.cpu, f.cpu_tasks) for f in floor], "Celery alone")
    # the same two with RabbitMQ as the Celery broker
    _rows(six, f"celery_scheduler on RabbitMQ, {rabbit[0].tasks:,} tasks, {ids:,} ordering ids x 10",
          rabbit)
    add_rows(six, "celery_scheduler on RabbitMQ", [d.cpu for d in rabbit], [d.cpu_tasks for d in rabbit])
    _rows(six, f"Celery alone on RabbitMQ, {backlog_tasks:,} queued plain tasks", rabbit_floor)
    six.add("celery_scheduler on RabbitMQ / Celery alone on RabbitMQ", Figure.of(
        [d.rate / f.rate if f.rate else float("nan") for d, f in zip(rabbit, rabbit_floor, strict=True)],
        "%"))
    add_rows(six, "Celery alone on RabbitMQ", [d.cpu for d in rabbit_floor],
             [d.cpu_tasks for d in rabbit_floor])
    for peer, drained in peers.items():
        _peer_rows(six, peer, drained, drains, f"{drained[0].tasks:,} tasks, {ids:,} ordering ids x 10",
                   ordered=peer != LONGTERM)
    six.method = [
        f"backlog of up to {backlog_tasks:,} tasks (filling stops after {fill_seconds} s; the "
        "figure names the count reached), due 5,000 per second of schedule time, written straight "
        "into the scheduler's tables with no dispatcher running; once all are overdue, "
        f"{WORKERS} solo workers and one dispatcher start. Drained = executed (the task body "
        f"started). Waiting stops after {window} s; the rate counts what started by then, "
        "over the time from the launch of the dispatcher (or, for Celery alone and the peers, of "
        "the workers or the peer's command) to the last start, so that start-up counts.",
        "order: for each ordering id, its tasks' first starts sorted by time must follow their "
        "schedule order.",
        f"Celery alone (the floor): the same number of plain Celery tasks with the same body, "
        f"queued with apply_async before {WORKERS} solo workers start; no scheduler involved, "
        "so no scheduler that releases to Celery workers can drain faster on this machine. "
        f"{runs} round(s), each system in turn in every round (ours, Celery alone, the same "
        "two on RabbitMQ, then the peers); 'celery_scheduler / Celery alone' and the ratios to "
        "the peers are the medians of the rounds' ratios (the machine's speed drifts within "
        "minutes, so the two of a ratio share a round).",
        f"procrastinate: the same tasks as jobs with schedule_at and lock = the ordering id, "
        f"inserted 1,000 per statement (its batch defer) with no worker running, then ANALYZE "
        f"(what autovacuum does soon after a bulk insert); once all are "
        f"overdue, {WORKERS} workers of concurrency 1 start; run with PostgreSQL's default "
        "synchronous_commit (on: each commit waits for its WAL flush, more durable than our "
        "Cassandra's periodic commit log) and with it off (durability like ours). "
        "celery-longterm-scheduler: the same "
        f"tasks stored with apply_async(eta=...) one by one; once all are overdue, {WORKERS} solo "
        "Celery workers and then its command (once a second) start. Filling stops after the same "
        "time as ours.",
        "on RabbitMQ: the same, with RabbitMQ as the Celery broker of the dispatcher and workers "
        "(threads pool, one task at a time: README, Brokers), and of the plain tasks.",
        "CPU: user + system CPU time of each part (dispatcher or scheduler command, workers, and "
        "the Kafka, Cassandra, Redis, RabbitMQ and PostgreSQL processes) from the first task start to the "
        "end of the wait, divided by the task bodies started meanwhile; machine busy = share of "
        "all cores not idle (whatever runs, this run or not). Near 100% busy, CPU is the limit "
        "and these rows say who spends it.",
    ]
    return six


def _seven(ctx: Context, runs: int, window: int) -> Section:
    seven = Section("7", "Ordering overhead: many tasks per ordering id vs unique ordering ids")
    per_id_tasks, fill_seconds = ctx.pick(1_000, 100_000), ctx.pick(3, 40)
    ids = ctx.pick(20, 1000)
    chained: list[Drain] = []
    unique: list[Drain] = []
    locked: list[Drain] = []
    for _ in range(runs):  # the three in turn, a round at a time
        chained.append(drain(ctx, per_id_tasks, ids, window, fill_seconds))
        unique.append(drain(ctx, per_id_tasks, per_id_tasks, window, fill_seconds))
        locked.append(peer_drain(ctx, PROCRASTINATE, per_id_tasks, ids, window, fill_seconds))
    _rows(seven, f"{ids:,} ordering ids x {per_id_tasks // ids}", chained)
    _rows(seven, "unique ordering ids", unique)
    seven.add("throughput with ordering / without",
              Figure.of([c.rate / u.rate if u.rate else float("nan") for c, u in zip(chained, unique,
                                                                                     strict=True)], "%"))
    seven.add("ordering ids whose tasks started out of order",
              Figure.of([d.out_of_order for d in chained]))
    _peer_rows(seven, PROCRASTINATE, locked, chained, f"{ids:,} locks x {per_id_tasks // ids}",
               ordered=True)
    seven.add(f"{LONGTERM}: not measured, it has no ordering (every due task is sent to Celery at "
              "once; scenario 6 shows the order they ran in)", Figure.of([]))
    seven.method = [
        f"the same backlog procedure as 6, up to {per_id_tasks:,} tasks each (filling stops after "
        f"{fill_seconds} s): {ids:,} ordering ids with {per_id_tasks // ids} tasks each "
        "(each runs only after the previous one of its id completed), then every task on its own "
        "ordering id.",
        f"procrastinate: the same {ids:,} ordering ids as locks (lock=, its jobs of one lock run one "
        "at a time in the order they were deferred), filled and drained as in 6.",
        f"{runs} round(s), the three in turn in each; ratios are taken round by round.",
    ]
    return seven


def run(ctx: Context) -> list[Section]:
    runs = ctx.pick(1, RUNS)
    window = ctx.pick(8, 30)
    return [_six(ctx, runs, window), _seven(ctx, runs, window)]
