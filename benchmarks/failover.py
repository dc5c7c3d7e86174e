"""Scenarios 5, 5b and 5c: a dispatcher killed under load, a Celery worker killed while it
holds released tasks or runs a long one (beside Celery's own ``eta=`` and procrastinate), and
tasks that run for many leases; all at the package's default leases.
"""

from __future__ import annotations

import itertools
import math
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from benchmarks import execlog
from benchmarks.context import Context, feed, utc
from benchmarks.execlog import Start
from benchmarks.harness import Stack, stack
from benchmarks.report import Section
from benchmarks.stats import Figure, percentile, ratio

__all__ = ["run"]

ORDERING_IDS = 1000
# Celery's default pool: the one whose event loop restores unacknowledged Redis messages
POOL = "prefork"


def first_starts(starts: list[Start]) -> dict[int, Start]:
    """The first start of each task (a re-released task may start twice)."""
    first: dict[int, Start] = {}
    for start in starts:
        if start.seq not in first or start.started < first[start.seq].started:
            first[start.seq] = start
    return first


# Each task of scenario 5 works this long (s): a run of an ordering id that starts less than
# this after the one before started overlapped it.
FAILOVER_BODY = 0.005


@dataclass(frozen=True)
class Failover:
    took_over: float  # s until the survivor leased every orphaned partition
    waited: float  # s: the longest any task not started at the kill waited past max(due, kill)
    around_p99: float  # lateness p99 (ms) of the tasks due from 2 s before to 15 s after the kill
    overall_p99: float  # ms
    missing: int
    duplicates: int
    order_violations: int
    overlaps: int


def _failover(ctx: Context) -> Failover:
    rate, duration, lead, grace = ctx.pick(100, 200), ctx.pick(8, 30), ctx.pick(3, 5), ctx.pick(20, 30)
    with stack(ctx.tmp) as s:
        app = s.use_client()
        victim = s.dispatcher()
        survivor = s.dispatcher()
        for _ in range(2):
            s.worker()
        from celery_scheduler import flush

        fed: list[tuple[float, int, int]] = []

        def publish(i: int, due: float) -> None:
            app.record.schedule((f"o{i % ORDERING_IDS}", i, due, FAILOVER_BODY), {}, at=utc(due),
                                wait=False)

        feeder = threading.Thread(target=lambda: fed.append(feed(publish, rate, duration, lead)))
        feeder.start()
        time.sleep(lead + 1 + duration / 3)
        victim.send_signal(signal.SIGKILL)
        killed = time.time()
        feeder.join()
        flush(app.app, 60)
        t0, total, _ = fed[0]
        s.wait_for_starts(total, timeout=t0 + duration + grace - time.time(), distinct=True)
        starts = s.starts()
        took_over = takeover_seconds(s.log_of(survivor), killed)
    first = first_starts(starts)
    waited = max((x.started - max(x.at, killed) for x in first.values() if x.started >= killed),
                 default=float("nan"))
    around = [x.lateness for x in first.values() if killed - 2 <= x.at <= killed + 15]
    order, overlaps = order_and_overlaps(starts, FAILOVER_BODY)
    return Failover(took_over, waited, percentile(around, 99) * 1000,
                    percentile([x.lateness for x in first.values()], 99) * 1000,
                    total - len(first), len(starts) - len(first), order, overlaps)


def order_and_overlaps(starts: list[Start], body: float) -> tuple[int, int]:
    """Per ordering id: first starts out of seq order, and runs that started less than *body*
    after an earlier run of the ordering id started (it was still running)."""
    by_id: dict[str, list[Start]] = {}
    for start in starts:
        by_id.setdefault(start.ordering_id, []).append(start)
    order = overlaps = 0
    for runs in by_id.values():
        firsts = sorted(first_starts(runs).values(), key=lambda x: x.seq)
        order += sum(1 for a, b in itertools.pairwise(firsts) if b.started < a.started)
        times = sorted(x.started for x in runs)
        overlaps += sum(1 for a, b in itertools.pairwise(times) if b - a < body)
    return order, overlaps


def takeover_seconds(log: str, killed: float) -> float:
    """Seconds from *killed* to the survivor's last "leased partition" line after it (NaN if none).

    The dispatcher logs that line once it holds a partition's lease, and releases from the
    partition in the same step.
    """
    last = float("nan")
    for line in log.splitlines():
        if "leased partition" not in line or not line.startswith("["):
            continue
        stamp = line[1:24]  # "2026-11-22 17:51:38,349", the machine's local time
        try:
            at = time.mktime(time.strptime(stamp[:19], "%Y-%m-%d %H:%M:%S")) + int(stamp[20:23]) / 1000
        except ValueError:
            continue
        if at >= killed:
            last = at - killed
    return last


def _worker_crash(ctx: Context, system: str, hold_seconds: float, body: float = 0.1,
                  count: int | None = None) -> Crash:
    """Kill the only worker while it holds tasks (or, with a long *body*, runs one), start
    another; what that did to the tasks. Ours at its default leases; Celery eta= with a
    visibility timeout of *hold_seconds*."""
    count, lead = count or ctx.pick(20, 100), ctx.pick(4, 6)
    ours = system == "celery_scheduler"
    env = {"BENCH_PREFETCH": "50"}
    if not ours:
        env["BENCH_VISIBILITY_TIMEOUT"] = str(hold_seconds)
    with stack(ctx.tmp, init=ours, env=env) as s:
        app = s.use_client()
        if ours:
            s.dispatcher()
        worker = s.worker(POOL, plain=not ours)
        due = time.time() + lead
        for i in range(count):  # distinct ordering ids: all due at once, all released at once
            if ours:
                app.record.schedule((f"crash{i}", i, due, body), {}, at=utc(due), wait=False)
            else:
                app.plain.apply_async((f"crash{i}", i, due, body), eta=utc(due), queue=s.name)
        if ours:
            from celery_scheduler import flush

            flush(app.app, 60)
        killed = _kill_and_replace(s, worker, lambda: s.worker(POOL, plain=not ours), due,
                                   after=min(5.0, body / 2) if body > 1 else 0.5)
        wait = hold_seconds + (15 if ours else ctx.pick(8, 110))
        s.wait_for_starts(count, timeout=wait, distinct=True)
        if body > 1:  # and for the one the kill cut short to start again
            deadline = time.monotonic() + wait
            while len(s.starts()) <= count and time.monotonic() < deadline:
                time.sleep(0.2)
        starts = s.starts()
    return crash_outcome(starts, count, killed, body)


def _kill_and_replace(s: Stack, worker: Any, replace: Callable[[], object], due: float,
                      after: float = 0.5) -> float:
    """*after* seconds after the first task started, SIGKILL *worker* and start another; the
    kill's time."""
    while not s.starts():
        if time.time() > due + 60:
            raise RuntimeError("no task started within 60 s of its due time")
        s.check_alive()
        time.sleep(0.05)
    time.sleep(after)
    worker.send_signal(signal.SIGKILL)
    killed = time.time()
    replace()
    return killed


@dataclass(frozen=True)
class Crash:
    """What a worker's crash did to the tasks it held."""

    recovered: float  # s from the kill until every task had started once; NaN if one never did
    missing: int  # tasks that never started
    duplicates: int  # starts beyond the first of each task
    rerun: float  # s from the kill until the task running at the kill started again; NaN if never


def crash_outcome(starts: list[Start], count: int, killed: float, body: float) -> Crash:
    """The figures of a crash at *killed* from the execution log; tasks' bodies last *body* s."""
    first = first_starts(starts)
    recovered = max(x.started for x in first.values()) - killed if len(first) == count else float("nan")
    before = [x for x in starts if x.started < killed]
    running = max(before, key=lambda x: x.started) if before else None
    rerun = float("nan")
    if running is not None and killed - running.started < body:  # its body was cut short
        again = [x.started for x in starts if x.seq == running.seq and x.started > killed]
        rerun = min(again) - killed if again else float("nan")
    return Crash(recovered, count - len(first), len(starts) - len(first), rerun)


# procrastinate: a worker is stalled once its heartbeat (every 10 s) is 30 s old; then 15 s more
STALLED_WAIT = 10 + 30 + 15


def _procrastinate_crash(ctx: Context) -> Crash:
    """The same crash for procrastinate, with its documented recipe for stalled jobs run once a
    second."""
    from benchmarks import peers_procrastinate as pg  # its driver is in the bench extra only

    count, sleep, lead = ctx.pick(20, 100), 0.1, ctx.pick(4, 6)
    with stack(ctx.tmp, init=False) as s, pg.database(s):
        worker = pg.worker(s)
        deferrer = pg.Deferrer(s.name)
        due = time.time() + lead
        try:
            for i in range(count):  # no lock: all due at once, like the Celery runs
                deferrer.defer(f"crash{i}", i, due, sleep=sleep)
        finally:
            deferrer.close()
        killed = _kill_and_replace(s, worker, lambda: pg.worker(s), due)
        outcome = crash_outcome(s.starts(), count, killed, sleep)
        # wait for every task, and for the one the kill cut short to run again
        while (math.isnan(outcome.recovered) or math.isnan(outcome.rerun)) \
                and time.time() < killed + STALLED_WAIT:
            pg.retry_stalled(s.name)
            s.check_alive()
            time.sleep(1)
            outcome = crash_outcome(s.starts(), count, killed, sleep)
    return outcome


def _crash_rows(section: Section, system: str, what: str, crashes: list[Crash]) -> None:
    ours = system == "celery_scheduler"
    section.add(f"{system}: every task ran, time from the kill ({what})",
                Figure.of([c.recovered for c in crashes], "s", 1))
    section.add(f"{system}: the task the kill cut short ran again, time from the kill",
                Figure.of([c.rerun for c in crashes], "s", 1))
    missing = Figure.of([c.missing for c in crashes])
    section.add(f"{system}: tasks that never ran", missing, "0" if ours else "",
                missing.median == 0 if ours else None)
    section.add(f"{system}: duplicate executions", Figure.of([c.duplicates for c in crashes]))


def run(ctx: Context) -> list[Section]:
    return [_dispatcher_kill(ctx), _worker_kill(ctx), _long_tasks(ctx)]


def _dispatcher_kill(ctx: Context) -> Section:
    five = Section("5", "Failover: SIGKILL one of two dispatchers under load")
    runs = ctx.pick(1, 3)
    results = [_failover(ctx) for _ in range(runs)]
    resumed = Figure.of([r.took_over for r in results], "s", 1)
    five.add("release resumed on the survivor after (it leased the last orphaned partition)",
             resumed, "≤ 8 s in every run", resumed.high <= 8)
    waited = Figure.of([r.waited for r in results], "s", 1)
    five.add("every task in flight at the kill or due after it started, time from the kill",
             waited, "≤ 15 s in every run", waited.high <= 15)
    five.add("lateness p99, tasks due from 2 s before to 15 s after the kill",
             Figure.of([r.around_p99 for r in results], "ms"))
    five.add("lateness p99, whole run", Figure.of([r.overall_p99 for r in results], "ms"))
    for name, values in (("tasks that never ran", [r.missing for r in results]),
                         ("order violations", [r.order_violations for r in results]),
                         ("overlapping runs of one ordering id", [r.overlaps for r in results])):
        figure = Figure.of(values)
        five.add(name, figure, "0", figure.high == 0)
    five.add("duplicate executions", Figure.of([r.duplicates for r in results]))
    five.method = [
        f"two dispatchers, two solo workers, 12 partitions, the package's default leases "
        f"(scheduler_start_lease_seconds 8, scheduler_lease_seconds 20, "
        f"scheduler_partition_lease_seconds 6); tasks of {FAILOVER_BODY * 1000:g} ms due at "
        f"{ctx.pick(100, 200)}/s for {ctx.pick(8, 30)} s over {ORDERING_IDS} ordering ids, "
        f"published {ctx.pick(3, 5)} s ahead; one dispatcher is SIGKILLed a third of the way in.",
        "resumed after = from the kill to the survivor's log line saying it holds the lease of "
        "the last partition it took over (it releases from a partition in the step it leases "
        "it). Bounded below by the Kafka session timeout (6 s) and the dead owner's partition "
        "lease running out: a survivor may not release before that, or two could release one "
        "partition.",
        "every task ... started = the longest any task that had not started at the kill waited "
        "past max(its due time, the kill): takeover, the tasks the killed dispatcher had marked "
        "but not sent (released again once their start lease and the 3 s a worker's first "
        "word may take are over, 8 + 3 s after their due time, the same attempt), and working off "
        "what fell due meanwhile. The target holds for the slowest run.",
        "order violations: first starts of an ordering id out of schedule order; overlapping: "
        f"a run that started less than {FAILOVER_BODY * 1000:g} ms (its body) after another run "
        "of its ordering id started. Tasks that never ran: within the wait, "
        f"{ctx.pick(20, 30)} s after the last one fell due.",
        "no peer: Celery eta= has no scheduler process of its own to fail over (its schedule "
        "lives in the workers, whose crash is 5b).",
        f"{runs} run(s), each on a fresh topic and keyspace.",
    ]
    return five


def _worker_kill(ctx: Context) -> Section:
    crash = Section("5b", "Crash of the worker holding released tasks, or running a long one")
    from celery_scheduler.config import Settings

    hold = Settings().lease_seconds  # the run lease: Celery eta=, on Redis, gets it as its timeout
    long_body = float(ctx.pick(20, 60))
    runs = ctx.pick(1, 3)
    runners: dict[str, tuple[str, Callable[[], Crash]]] = {
        "celery_scheduler": ("default leases", lambda: _worker_crash(ctx, "celery_scheduler", hold)),
        "Celery eta=": (f"visibility_timeout = {hold:g} s",
                        lambda: _worker_crash(ctx, "Celery eta=", hold)),
        "procrastinate": ("stalled jobs retried once a second", lambda: _procrastinate_crash(ctx)),
    }
    crashes = {system: [runner() for _ in range(runs)] for system, (_, runner) in runners.items()}
    for system, (what, _) in runners.items():
        _crash_rows(crash, system, what, crashes[system])
    for peer in ("Celery eta=", "procrastinate"):
        pairs = list(zip(crashes["celery_scheduler"], crashes[peer], strict=True))
        crash.add(f"celery_scheduler / {peer}: time from the kill until every task ran",
                  Figure.of([ratio(a.recovered, b.recovered) for a, b in pairs], "%", 0))
    long_runs = {system: [_worker_crash(ctx, system, hold, body=long_body, count=1)
                          for _ in range(runs)] for system in ("celery_scheduler", "Celery eta=")}
    rerun = Figure.of([c.rerun for c in long_runs["celery_scheduler"]], "s", 1)
    crash.add(f"celery_scheduler: a {long_body:g} s task killed mid-run started again, time from "
              "the kill", rerun, "≤ 30 s in every run", rerun.high <= 30)
    crash.add(f"Celery eta= (visibility_timeout = {hold:g} s): the same, time from the kill",
              Figure.of([c.rerun for c in long_runs["Celery eta="]], "s", 1))
    crash.add("celery-longterm-scheduler: not measured apart; a task its command sent is an ordinary "
              "Celery message, recovered as the Celery eta= rows show", Figure.of([]))
    crash.method = [
        f"{ctx.pick(20, 100)} tasks of 0.1 s on distinct ordering ids, all due at once; one worker "
        f"(--pool={POOL} --concurrency=1, prefetch multiplier 50) holds them; half a second after "
        "the first started it is SIGKILLed and a second worker started. Time = last first start - "
        "kill; n/a when some task never ran within the wait. The task the kill cut short (the "
        "last to start before the kill, less than its 0.1 s before it) ran again: time from the "
        "kill to its next start, n/a when it did not start again within the wait (Celery "
        "acknowledges a message when its task starts, unless acks_late is set).",
        f"The long task: one task of {long_body:g} s, its worker SIGKILLed 5 s into it (beats "
        "sent every 2 s until then) and another started.",
        "celery_scheduler, at its defaults: a task that was held but never started is released "
        "again once its start lease (8 s from its due time) and 3 s are over; one that had "
        "started (a beat came) once no beat came for the run lease (20 s) and 2.5 s, as its next "
        "attempt after the first retry's backoff (0.5-1 s). The held messages stay "
        "unacknowledged in Redis, and are skipped as stale when Redis gives them back. Celery "
        "eta= waits for the Redis transport to restore unacknowledged messages after "
        f"visibility_timeout (default 3600 s, here {hold:g} s, the run lease), in sweeps about "
        "every 100 s (kombu's unacked_restore_interval 10 s x unacked_restore_throttle 10, "
        "defaults kept); a running task's message was acknowledged when it started, so that "
        "task is not run again. The wait after the lease/timeout is 15 s for celery_scheduler "
        f"and {ctx.pick(8, 110)} s for Celery eta=.",
        "procrastinate: the same tasks deferred to one worker of concurrency 1 on PostgreSQL, "
        "killed and replaced the same way. Its worker fetches a job per free slot (nothing "
        "prefetched), so it held the one job it was running, which stays 'doing' until the "
        "application retries it: its documentation's recipe, a periodic task calling "
        "get_stalled_jobs (jobs of workers whose heartbeat, sent every 10 s, is 30 s old) and "
        "retry_job, suggested every 10 minutes, here run once a second from the benchmark. "
        "Without it the job never runs again. The wait ends "
        f"{STALLED_WAIT} s after the kill.",
        f"{runs} run(s) of each.",
    ]
    return crash


@dataclass(frozen=True)
class LongRun:
    """Of each task, one trial: how many runs of it started (a second would mean it was
    released again), how many reached the end of its body, and how long the one that did ran."""

    starts: list[int]
    ended: list[int]
    lengths: list[float]  # s, of each task's run that ended (nan: none did)


def _long(ctx: Context, body: float, tasks: int) -> LongRun:
    """*tasks* tasks of *body* seconds on as many solo workers, at the default leases."""
    with stack(ctx.tmp) as s:
        app = s.use_client()
        s.dispatcher()
        for _ in range(tasks):
            s.worker()
        due = time.time() + 3
        for i in range(tasks):
            app.record.schedule((f"long{i}", i, due, body), {}, at=utc(due), wait=False)
        from celery_scheduler import flush

        flush(app.app, 60)
        deadline = time.monotonic() + body + 120
        while len(execlog.read_ends(s.execlog)) < tasks and time.monotonic() < deadline:
            s.check_alive()
            time.sleep(1)
        time.sleep(5)  # a second release of one would have started by now
        starts, ends = s.starts(), execlog.read_ends(s.execlog)
    began = {(x.ordering_id, x.seq, x.pid): x.started for x in starts}
    ids = [f"long{i}" for i in range(tasks)]
    lengths = {o: at - began[(o, seq, pid)] for o, seq, at, pid in ends if (o, seq, pid) in began}
    return LongRun([sum(1 for x in starts if x.ordering_id == o) for o in ids],
                   [sum(1 for end in ends if end[0] == o) for o in ids],
                   [lengths.get(o, float("nan")) for o in ids])


def _long_tasks(ctx: Context) -> Section:
    section = Section("5c", "Tasks that run for many leases")
    body, tasks = float(ctx.pick(60, 900)), 3
    result = _long(ctx, body, tasks)
    section.add(f"runs of a task of {body / 60:g} min that reached its end",
                Figure.of(result.ended), "1 in every run", all(n == 1 for n in result.ended))
    section.add("runs of it started (a second would mean it was released again)",
                Figure.of(result.starts), "1 in every run", all(n == 1 for n in result.starts))
    section.add("how long its run lasted", Figure.of(result.lengths, "s", 1),
                f"≥ {body:g} s in every run", all(length >= body for length in result.lengths))
    section.method = [
        f"{tasks} tasks of {body:g} s on distinct ordering ids, each on a solo worker of its own "
        "(each task one trial: n counts tasks, all run side by side), "
        "one dispatcher, the package's default leases (run lease 20 s: each task outlives it "
        f"{body / 20:g} times, beating every 2 s) and no time limit: before the beats, a task "
        "was killed at a hard time limit just below its lease (300 s by default).",
    ]
    return section
