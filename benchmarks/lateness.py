"""Scenarios 3 and 3b: release lateness at a steady rate of due tasks, beside the peers.

Lateness is the time a task body started minus the time it was scheduled for, measured
in the task. Each system gets the same load: task i is due at ``t0 + i / rate`` and is
published ``lead`` seconds before it is due, from this process. celery_scheduler runs one
dispatcher and two solo Celery workers; Celery's own ``eta=`` runs two solo workers on the
Redis broker; RQ runs two SimpleWorkers, one of which holds RQ's own scheduler (built into
RQ since 1.2: ``Queue.enqueue_at`` + ``rq worker --with-scheduler``, not the separate
rq-scheduler package).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import redis

from benchmarks import peers_longterm
from benchmarks.context import Context, feed, utc
from benchmarks.cpu import CpuMeter, CpuUse, add_cost_targets, add_rows, local_services
from benchmarks.execlog import Start
from benchmarks.harness import RABBITMQ_URL, REDIS_URL, Stack, log, stack
from benchmarks.report import Row, Section
from benchmarks.stats import Figure, percentile, ratio

__all__ = ["Load", "Outcome", "measure", "parts_of", "run", "systems"]

ORDERING_IDS = 1000
WORKERS = 2
# Threads that publish a peer's load: its publish call waits for a round trip (Redis,
# PostgreSQL), and one thread at a time fell behind at 1,000/s. Ours publishes in its batched
# form (schedule(..., wait=False)) from one thread; the RabbitMQ rows (100/s) share one
# connection, so one thread.
PUBLISHER_THREADS = 4
# A run whose publisher put fewer of its tasks out before they were due is invalid: its
# lateness measures the publisher, and it is not compared.
ON_TIME_SHARE = 0.99
PROCRASTINATE = "procrastinate"
LONGTERM = "celery-longterm-scheduler"
SYSTEMS = ("celery_scheduler", "Celery eta=", "RQ enqueue_at", PROCRASTINATE, LONGTERM)
# The same two again with RabbitMQ as the Celery broker, at 100/s only (3b).
ON_RABBITMQ = " on RabbitMQ"
RABBITMQ_SYSTEMS = (f"celery_scheduler{ON_RABBITMQ}", f"Celery eta={ON_RABBITMQ}")
# celery-longterm-scheduler with its command run as its documentation suggests (3b only,
# full runs only: a task waits up to the next run, 5 minutes)
LONGTERM_CRON = f"{LONGTERM}, its command every 5 min"
# Seqs of the unmeasured run each system gets before its measured ones: its new processes
# connect and fill their caches, and a JVM service still compiling is not measured (on a
# Cassandra just started, its C2 compiler threads took 184, then 104, then 47 ms of CPU a
# second over three 30 s runs at 100 tasks/s: half of its CPU in the first).
WARM_UP_SEQ = 90_000_000
RUNS = 3  # rounds of every system in turn (full runs)


@dataclass(frozen=True)
class Load:
    rate: float
    duration: float
    lead: float
    grace: float  # how long after the last due time to wait for stragglers


@dataclass(frozen=True)
class Outcome:
    lateness: list[float]  # seconds, first start of each task
    expected: int  # tasks published
    planned: int  # tasks the load asked for
    published_late: int  # tasks the publisher could only publish after they were due
    duplicates: int
    # celery_scheduler only, first start of each task: due -> published to Celery by the
    # dispatcher, and published -> body started (broker, worker, the worker's store check)
    to_release: list[float] = field(default_factory=list)
    after_release: list[float] = field(default_factory=list)
    cpu: CpuUse | None = None  # from the first publish to the end of the wait
    # first start of each task due a second or more after the load generator had published
    # (and flushed) everything: nothing is being scheduled or ingested meanwhile
    quiet: list[float] = field(default_factory=list)
    # the due time of each task of *lateness*, in the same order
    due: list[float] = field(default_factory=list)

    @property
    def on_time(self) -> float:
        """The share of the planned tasks published before they were due."""
        return (self.expected - self.published_late) / self.planned if self.planned else math.nan

    @property
    def valid(self) -> bool:
        return self.on_time >= ON_TIME_SHARE

    @property
    def ran(self) -> float:
        return len(self.lateness) / self.expected if self.expected else float("nan")

    def ms(self, q: float) -> float:
        return percentile(self.lateness, q) * 1000


Publish = Callable[[int, float], None]


@contextmanager
def systems(ctx: Context, name: str, env: dict[str, str] | None = None
            ) -> Iterator[tuple[Stack, Publish, Callable[[], None]]]:
    """The running system *name*: its stack, how to publish task (seq, due), and a final flush.

    Publishing the same seq twice schedules the same task twice, by each system's own notion
    of a task's identity: our uniqueness key, procrastinate's queueing lock, the task or job
    id for the others.
    """
    broker = RABBITMQ_URL if name.endswith(ON_RABBITMQ) else None
    name = name.removesuffix(ON_RABBITMQ)
    scheduler = name == "celery_scheduler"
    with stack(ctx.tmp, init=scheduler, env=env, broker=broker) as s:
        app = s.use_client()
        if name == PROCRASTINATE:
            with _procrastinate(s) as publish:
                yield s, publish, lambda: None
            return
        if scheduler:
            s.dispatcher()
        for _ in range(WORKERS):
            s.rq_worker() if name == "RQ enqueue_at" else s.worker(plain=not scheduler)
        if scheduler:
            from celery_scheduler import flush

            def publish(seq: int, due: float) -> None:
                app.record.schedule((f"o{seq % ORDERING_IDS}", seq, due), {}, at=utc(due), wait=False)

            def flush_all() -> None:
                flush(app.app, 60)

            yield s, publish, flush_all
        elif name == "Celery eta=":
            connection = app.app.connection_for_write(broker) if broker else None

            def publish(seq: int, due: float) -> None:
                app.plain.apply_async((f"o{seq % ORDERING_IDS}", seq, due), eta=utc(due), queue=s.name,
                                      task_id=f"{s.name}-{seq}", connection=connection)

            try:
                yield s, publish, lambda: None
            finally:
                if connection is not None:
                    connection.release()
        elif name in (LONGTERM, LONGTERM_CRON):
            if name == LONGTERM:
                peers_longterm.ticker(s)
            else:
                peers_longterm.ticker(s, peers_longterm.DOCUMENTED_INTERVAL, aligned=True)

            def publish(seq: int, due: float) -> None:
                peers_longterm.schedule(app, s, f"o{seq % ORDERING_IDS}", seq, due)

            try:
                yield s, publish, lambda: None
            finally:
                peers_longterm.clean(s.name)
        else:
            from rq import Queue

            queue = Queue(s.name, connection=redis.Redis.from_url(REDIS_URL))

            def publish(seq: int, due: float) -> None:
                queue.enqueue_at(utc(due), app.rq_record, f"o{seq % ORDERING_IDS}", seq, due,
                                 job_id=f"{s.name}-{seq}", result_ttl=0)

            yield s, publish, lambda: None


@contextmanager
def _procrastinate(s: Stack) -> Iterator[Publish]:
    """procrastinate's workers on a database of the stack's own; how to defer a task."""
    from benchmarks import peers_procrastinate  # its driver is in the bench extra only

    with peers_procrastinate.database(s):
        for _ in range(WORKERS):
            peers_procrastinate.worker(s)
        deferrer = peers_procrastinate.Deferrer(s.name)

        def publish(seq: int, due: float) -> None:
            ordering_id = f"o{seq % ORDERING_IDS}"
            deferrer.defer(ordering_id, seq, due, lock=ordering_id, queueing_lock=f"s{seq}")

        try:
            yield publish
        finally:
            deferrer.close()


def measure(s: Stack, publish: Publish, flush: Callable[[], None], load: Load, first_seq: int,
            threads: int = 1) -> Outcome:
    """Run *load* through a running system, published from *threads* threads; tasks get seqs
    from *first_seq* on."""
    late = 0
    counting = threading.Lock()

    def timed(i: int, due: float) -> None:
        nonlocal late
        if time.time() > due:
            with counting:
                late += 1
        publish(first_seq + i, due)

    # this process started the stack's processes: count its own CPU only
    meter = CpuMeter({**parts_of(s), "load generator": [os.getpid()], **local_services()},
                     alone=["load generator"])
    meter.start()
    t0, total, planned = feed(timed, load.rate, load.duration, load.lead, threads)
    flush()
    published = time.time()
    last_due = t0 + (total - 1) / load.rate
    deadline = last_due + load.grace
    while time.time() < deadline:
        mine = [x for x in s.starts() if first_seq <= x.seq < first_seq + total]
        if len({x.seq for x in mine}) >= total:
            break
        s.check_alive()
        time.sleep(0.5)
    cpu = meter.stop()
    first: dict[int, Start] = {}
    mine = [x for x in s.starts() if first_seq <= x.seq < first_seq + total]
    for start in mine:
        if start.seq not in first or start.started < first[start.seq].started:
            first[start.seq] = start
    released = [x for x in first.values() if x.released is not None]
    outcome = Outcome([x.lateness for x in first.values()], total, planned, late,
                      len(mine) - len(first),
                      [x.released - x.at for x in released if x.released is not None],
                      [x.started - x.released for x in released if x.released is not None], cpu,
                      [x.lateness for x in first.values() if x.at >= published + 1],
                      [x.at for x in first.values()])
    log(f"{load.rate:g}/s for {load.duration:g}s: {total} of {planned} published, {len(first)} ran, "
        f"p99 {outcome.ms(99):.1f} ms")
    return outcome


def _ratios(section: Section, ours: list[Outcome], peer: list[Outcome], name: str,
            us: str = "celery_scheduler") -> Row:
    """Our lateness over the peer's, run by run (runs in the same order on the same machine);
    n/a where the peer's is not above zero (it started tasks before they were due) or where
    either run is invalid (its load was not published on time). Returns the p99 row."""
    rows = [section.add(f"{us} / {name}: lateness p{q}",
                        Figure.of([ratio(a.ms(q), b.ms(q)) if b.ms(q) > 0 and a.valid and b.valid
                                   else math.nan for a, b in zip(ours, peer, strict=False)], "x", 1))
            for q in (50, 99)]
    return rows[-1]


# the part a process counts in, by the kind it was spawned as (its log's name says)
PARTS = {"dispatcher": "dispatcher", "longterm": peers_longterm.PART}


def parts_of(s: Stack) -> dict[str, list[int]]:
    """The stack's processes by part: its dispatcher(s) or scheduler command, and its workers."""
    parts: dict[str, list[int]] = {}
    for process in s.processes:
        kind = s.logs[process.pid].name[len(s.name) + 1:].rsplit("-", 1)[0]
        parts.setdefault(PARTS.get(kind, "workers"), []).append(process.pid)
    return parts


def _rows(section: Section, system: str, outcomes: list[Outcome], p50_target: float | None,
          p99_target: float | None) -> dict[str, Row]:
    """The system's rows; returns its CPU-per-task rows by part (empty without CPU figures)."""
    ours = system == "celery_scheduler"
    valid = all(o.valid for o in outcomes)
    invalid = "" if valid else (f"invalid: fewer than {ON_TIME_SHARE:.0%} of the load published "
                                "before it was due")
    p50 = Figure.of([o.ms(50) for o in outcomes], "ms", 1)
    p99 = Figure.of([o.ms(99) for o in outcomes], "ms", 1)
    # ours is judged on every run; an invalid run of ours (its own publisher fell behind)
    # meets no target, and says why
    section.add(f"{system}: lateness p50", p50, f"≤ {p50_target:g} ms" if ours and p50_target else "",
                valid and p50.high <= p50_target if ours and p50_target else None, invalid)
    section.add(f"{system}: lateness p99", p99, f"≤ {p99_target:g} ms" if ours and p99_target else "",
                valid and p99.high <= p99_target if ours and p99_target else None, invalid)
    # every system's load must be published on time for its run to count; only ours is a
    # target of this report (a peer's invalid run says so in its lateness rows)
    section.add(f"{system}: tasks published before they were due",
                Figure.of([o.on_time for o in outcomes], "%", 1),
                f"≥ {ON_TIME_SHARE:.0%} (else the run is invalid)", valid if ours else None,
                "" if valid or ours else "invalid")
    section.add(f"{system}: lateness max", Figure.of([o.ms(100) for o in outcomes], "ms", 1))
    if all(len(o.quiet) >= 100 for o in outcomes):
        for q in (50, 99):
            section.add(f"{system}: lateness p{q}, tasks due once everything was published",
                        Figure.of([percentile(o.quiet, q) * 1000 for o in outcomes], "ms", 1))
    if all(o.to_release for o in outcomes):
        for q in (50, 99):
            section.add(f"{system}: of which due to published by the dispatcher, p{q}",
                        Figure.of([percentile(o.to_release, q) * 1000 for o in outcomes], "ms", 1))
            section.add(f"{system}: of which published to body started, p{q}",
                        Figure.of([percentile(o.after_release, q) * 1000 for o in outcomes], "ms", 1))
    ran = section.add(f"{system}: tasks run by the deadline", Figure.of([o.ran for o in outcomes], "%", 1))
    if ours:
        ran.target, ran.met = "≥ 99% in every run", ran.figure.low >= 0.99
    if any(x < 0 for o in outcomes for x in o.lateness):
        section.add(f"{system}: tasks started before their due time",
                    Figure.of([sum(1 for x in o.lateness if x < 0) for o in outcomes]))
    if any(o.expected < o.planned for o in outcomes):
        section.add(f"{system}: tasks published by the last due time (publisher too slow)",
                    Figure.of([o.expected / o.planned for o in outcomes], "%", 1))
    if any(o.published_late for o in outcomes):
        section.add(f"{system}: tasks published after their due time (publisher behind)",
                    Figure.of([o.published_late for o in outcomes]))
    if any(o.duplicates for o in outcomes):
        section.add(f"{system}: duplicate executions", Figure.of([o.duplicates for o in outcomes]))
    uses = [o.cpu for o in outcomes if o.cpu is not None]
    if uses and len(uses) == len(outcomes):
        return add_rows(section, system, uses, [len(o.lateness) for o in outcomes])
    return {}


def _cpu(outcomes: list[Outcome]) -> list[tuple[CpuUse, int]]:
    return [(o.cpu, len(o.lateness)) for o in outcomes if o.cpu is not None]


def run(ctx: Context) -> list[Section]:
    # quick runs wait 6 s too: procrastinate finds a job that fell due while nothing was
    # deferred only at its next poll, every 5 s
    slow = Load(rate=100, duration=ctx.pick(2, 20), lead=ctx.pick(2, 5), grace=ctx.pick(6, 15))
    fast = Load(rate=1000, duration=ctx.pick(2, 60), lead=ctx.pick(2, 5), grace=ctx.pick(6, 20))
    runs = ctx.pick(1, RUNS)
    # one unmeasured run of the light load first, on every system's own processes (WARM_UP_SEQ)
    warm = Load(rate=slow.rate, duration=ctx.pick(2, 10), lead=slow.lead, grace=slow.grace)
    results: dict[str, tuple[list[Outcome], list[Outcome]]] = {}
    errors = []
    failed: set[str] = set()
    cron = Load(rate=slow.rate, duration=slow.duration, lead=slow.lead,
                grace=peers_longterm.DOCUMENTED_INTERVAL + slow.grace)
    # the systems in turn, a round at a time (A B A B): a machine that slows down in the middle
    # of the group weighs on every system, and ratios are taken round by round
    for k in range(runs):
        for system in SYSTEMS + RABBITMQ_SYSTEMS + (() if ctx.quick else (LONGTERM_CRON,)):
            if system in failed:
                continue
            both = system in SYSTEMS  # the RabbitMQ ones and the cron one run 3b only
            load = cron if system == LONGTERM_CRON else slow
            threads = 1 if system == SYSTEMS[0] or system in RABBITMQ_SYSTEMS else PUBLISHER_THREADS
            slow_outcomes, fast_outcomes = results.setdefault(system, ([], []))
            try:
                with systems(ctx, system) as (s, publish, flush):
                    if system != LONGTERM_CRON:  # its run waits for the next 5-minute mark
                        measure(s, publish, flush, warm, WARM_UP_SEQ, threads)
                    slow_outcomes.append(measure(s, publish, flush, load, (k + 1) * 10_000_000,
                                                 threads))
                    if both:
                        fast_outcomes.append(measure(s, publish, flush, fast,
                                                     (k + 10) * 10_000_000, threads))
            except Exception as exc:
                errors.append(f"{system}: {type(exc).__name__}: {exc}"[:500])
                failed.add(system)  # its rounds so far are kept; it is not tried again
                if len(slow_outcomes) > len(fast_outcomes) and both:
                    slow_outcomes.pop()  # a round is its 3b and 3 runs, both or neither
    results = {system: runs_ for system, runs_ in results.items() if runs_[0]}
    three = Section("3", f"Release lateness at {fast.rate:g} due tasks/s for {fast.duration:g} s")
    three_b = Section("3b", f"Release lateness at {slow.rate:g} due tasks/s for {slow.duration:g} s")
    cost_rows: dict[str, Row] = {}
    for system, (slow_outcomes, fast_outcomes) in results.items():
        if fast_outcomes:
            _rows(three, system, fast_outcomes, 20, 100)
        rows = _rows(three_b, system, slow_outcomes, None, 20)
        if system == SYSTEMS[0]:
            cost_rows = rows
    ours, eta = results.get(SYSTEMS[0]), results.get(SYSTEMS[1])
    if ours is not None and eta is not None:
        # what a task costs us beyond what Celery eta= costs on the same load
        add_cost_targets(three_b, cost_rows, _cpu(ours[0]), _cpu(eta[0]), SYSTEMS[1])
    # punctuality against Celery's own eta= in the same run: within 3x at 100/s, and no worse
    # at 1000/s
    for section, pick, limit in ((three, 1, 1), (three_b, 0, 3)):
        for peer in (*SYSTEMS[1:], LONGTERM_CRON):
            if ours is not None and results.get(peer, ([], []))[pick]:
                row = _ratios(section, ours[pick], results[peer][pick], peer)
                if peer == SYSTEMS[1]:
                    row.target = f"≤ {limit:g}x in every run"
                    row.met = None if math.isnan(row.figure.median) else row.figure.high <= limit
    rabbit, rabbit_eta = (results.get(name) for name in RABBITMQ_SYSTEMS)
    if rabbit is not None and rabbit_eta is not None:
        _ratios(three_b, rabbit[0], rabbit_eta[0], RABBITMQ_SYSTEMS[1], RABBITMQ_SYSTEMS[0])
    if rabbit is not None and ours is not None:
        on_redis = Figure.of([ratio(a.ms(99), b.ms(99)) for a, b in zip(rabbit[0], ours[0], strict=False)],
                             "x", 1)
        three_b.add(f"{RABBITMQ_SYSTEMS[0]} / celery_scheduler on Redis: lateness p99", on_redis,
                    "≤ 2x", on_redis.median <= 2)
    method = [
        f"task i is due at t0 + i/rate and published {fast.lead:g} s before it is due "
        f"(batched form for celery_scheduler, from one thread; the peers' one call a task from "
        f"{PUBLISHER_THREADS} threads, so that a call that waits for a round trip does not hold "
        f"the load back; the RabbitMQ rows from one thread on one connection); {ORDERING_IDS} "
        "ordering ids; the task body logs its start; lateness = start - due time, first start of "
        "each task.",
        f"a run whose publisher put out fewer than {ON_TIME_SHARE:.0%} of its tasks before they "
        "were due is invalid: its lateness rows say so, it meets no target, and no ratio is taken "
        "with it (n/a).",
        "celery_scheduler's lateness is split at the moment the dispatcher published the task to "
        "Celery (a header the benchmark app stamps): before it, the dispatcher (ingest, loading, "
        "the release marking); after it, Redis, the worker's prefetch queue and its store check. "
        "With scheduler_release_eta (not the default) a task marked ahead of its due time is "
        "published then, its due time as Celery's eta: its due to published is negative, and "
        "published to started includes the time the worker held it. "
        "Each part's percentile is taken on its own, so the two do not add up to the total's.",
        f"'once everything was published': tasks due from 1 s after the load generator's last "
        f"publish (and flush) on, about the last {fast.lead:g} s of due times: no schedule calls "
        "or ingest compete for the machine then.",
        "CPU: user + system CPU time of each part (dispatcher, workers, the load generator that "
        "publishes, and the Kafka, Cassandra, Redis and PostgreSQL processes) from the first publish to the "
        "end of the wait, divided by the tasks that ran; machine busy = share of all cores not "
        "idle over that time. Near 100% busy, queueing for CPU is what makes tasks late.",
        f"{WORKERS} workers per system (Celery: --pool=solo; RQ: SimpleWorker, RQ's own scheduler "
        "via enqueue_at and --with-scheduler); celery_scheduler: one dispatcher, 12 partitions.",
        "'on RabbitMQ' (3b only): celery_scheduler and Celery eta= with RabbitMQ as the Celery "
        "broker (workers on the threads pool, one task at a time: README, Brokers); the ratio to "
        "celery_scheduler on Redis is run by run.",
        f"procrastinate: defer with schedule_at, lock = the ordering id (its jobs of one lock run "
        f"one at a time, as ours do) and queueing_lock = the task's key (a second waiting job with "
        f"it is refused, as ours are), one by one through its synchronous connector; {WORKERS} "
        "workers of concurrency 1 with its defaults (LISTEN/NOTIFY, and a poll every 5 s, which is "
        "what finds a job that became due while nothing was deferred), on a "
        "database of its own (PostgreSQL from Debian, scripts/services up postgres).",
        f"celery-longterm-scheduler: apply_async(eta=...) on its task class stores the call in "
        f"Redis; its command (here Scheduler.execute_pending(now), what `celery longterm_scheduler` "
        f"runs, from one long-lived process) sends what is due every {peers_longterm.INTERVAL:g} s, "
        f"to {WORKERS} solo Celery workers. Its documentation suggests a cron job every "
        f"{peers_longterm.DOCUMENTED_INTERVAL / 60:g} minutes: '{LONGTERM_CRON}' (3b, full runs) "
        f"runs it at the wall clock's multiples of {peers_longterm.DOCUMENTED_INTERVAL:g} s, "
        f"as cron does, and waits {peers_longterm.DOCUMENTED_INTERVAL + slow.grace:g} s after the "
        "last due time: a task waits for the next run, so its lateness depends on where the load "
        "fell between two runs.",
        "celery-longterm-scheduler and RQ store due times in whole seconds (a sorted set scored "
        "by the second), so they may start a task up to 1 s before it is due: counted in "
        "'started before their due time', and taken as negative lateness in the percentiles.",
        "a publisher slower than the rate stops at the last due time; what it did not publish is "
        "shown, and left out of the other figures.",
        f"waiting ends {fast.grace:g} s ({slow.grace:g} s for 3b) after the last due time; tasks not "
        "started by then count in 'tasks run by the deadline', not in the percentiles.",
        f"before its measured runs, each system (but '{LONGTERM_CRON}') runs {warm.duration:g} s "
        f"of the {slow.rate:g}/s load, unmeasured: its processes are new, and Kafka's and Cassandra's "
        "JIT compilers are busy for minutes after a start.",
        f"{runs} round(s): in each, every system in turn on processes of its own, each a warm-up, "
        "a 3b run, then a 3 run on the same processes (the RabbitMQ rows and "
        f"'{LONGTERM_CRON}' a 3b run only); ratios are taken round by round.",
    ]
    three.method = method
    three_b.method = method
    if errors:
        three.error = three_b.error = "; ".join(errors)
    return [three, three_b]
