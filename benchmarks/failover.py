"""Scenarios 5 and 5b: a dispatcher killed under load, and a Celery worker killed while it
holds released tasks, beside Celery's own ``eta=``.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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


def _failover(ctx: Context) -> tuple[float, float, float, float, int, int]:
    """(seconds until the survivor leased every orphaned partition, seconds until the worst-hit
    task ran, p99 lateness ms around the kill, p99 overall, missing, duplicates)."""
    rate, duration, lead, grace = ctx.pick(100, 200), ctx.pick(8, 30), ctx.pick(3, 5), ctx.pick(12, 20)
    with stack(ctx.tmp) as s:
        app = s.use_client()
        victim = s.dispatcher()
        survivor = s.dispatcher()
        for _ in range(2):
            s.worker()
        from celery_scheduler import flush

        fed: list[tuple[float, int, int]] = []

        def publish(i: int, due: float) -> None:
            app.record.schedule((f"o{i % ORDERING_IDS}", i, due), {}, at=utc(due), wait=False)

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
    after = [x for x in first.values() if x.at >= killed - 2]
    resumed = max((x.started - max(x.at, killed) for x in after), default=float("nan"))
    around = [x.lateness for x in first.values() if killed - 2 <= x.at <= killed + 15]
    return (took_over, resumed, percentile(around, 99) * 1000,
            percentile([x.lateness for x in first.values()], 99) * 1000,
            total - len(first), len(starts) - len(first))


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


def _worker_crash(ctx: Context, system: str, hold_seconds: float) -> Crash:
    """Kill the only worker while it holds tasks, start another; what that did to the tasks."""
    count, sleep, lead = ctx.pick(20, 100), 0.1, ctx.pick(4, 6)
    ours = system == "celery_scheduler"
    env = {"BENCH_PREFETCH": "50"}
    if ours:
        env["BENCH_LEASE"] = str(hold_seconds)
    else:
        env["BENCH_VISIBILITY_TIMEOUT"] = str(hold_seconds)
    with stack(ctx.tmp, init=ours, env=env) as s:
        app = s.use_client()
        if ours:
            s.dispatcher()
        worker = s.worker(POOL, plain=not ours)
        due = time.time() + lead
        for i in range(count):  # distinct ordering ids: all due at once, all released at once
            if ours:
                app.record.schedule((f"crash{i}", i, due, sleep), {}, at=utc(due), wait=False)
            else:
                app.plain.apply_async((f"crash{i}", i, due, sleep), eta=utc(due), queue=s.name)
        if ours:
            from celery_scheduler import flush

            flush(app.app, 60)
        killed = _kill_and_replace(s, worker, lambda: s.worker(POOL, plain=not ours), due)
        s.wait_for_starts(count, timeout=hold_seconds + (15 if ours else ctx.pick(8, 110)),
                          distinct=True)
        starts = s.starts()
    return crash_outcome(starts, count, killed, sleep)


def _kill_and_replace(s: Stack, worker: Any, replace: Callable[[], object], due: float) -> float:
    """Half a second after the first task started, SIGKILL *worker* and start another; the kill's time."""
    while not s.starts():
        if time.time() > due + 60:
            raise RuntimeError("no task started within 60 s of its due time")
        s.check_alive()
        time.sleep(0.05)
    time.sleep(0.5)
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
    five = Section("5", "Failover: SIGKILL one of two dispatchers under load")
    runs = ctx.pick(1, 3)
    results = [_failover(ctx) for _ in range(runs)]
    resumed = Figure.of([r[0] for r in results], "s", 1)
    five.add("release resumed on the survivor after (it leased the last orphaned partition)",
             resumed, "≤ 8 s in every run", resumed.high <= 8)
    five.add("the worst-hit task ran after (backlog caught up)", Figure.of([r[1] for r in results], "s", 1))
    five.add("lateness p99, tasks due from 2 s before to 15 s after the kill",
             Figure.of([r[2] for r in results], "ms"))
    five.add("lateness p99, whole run", Figure.of([r[3] for r in results], "ms"))
    five.add("tasks that never ran", Figure.of([r[4] for r in results]))
    five.add("duplicate executions", Figure.of([r[5] for r in results]))
    five.method = [
        f"two dispatchers, two solo workers, 12 partitions; tasks due at {ctx.pick(100, 200)}/s "
        f"for {ctx.pick(8, 30)} s, published {ctx.pick(3, 5)} s ahead; one dispatcher is SIGKILLed "
        "a third of the way in.",
        "resumed after = from the kill to the survivor's log line saying it holds the lease of "
        "the last partition it took over (it releases from a partition in the step it leases "
        "it). Bounded below by the Kafka session timeout (6 s) and the dead owner's partition "
        "lease running out (scheduler_partition_lease_seconds, default 6 s, renewed every third "
        "of it): a survivor may not release before that, or two could release one partition. "
        "The target holds for the slowest run (with 3 runs, their p99).",
        "tasks that never ran (within the wait, 20 s after the last one fell due): tasks the "
        "killed dispatcher had marked released in Cassandra ahead of their due time "
        "(scheduler_release_ahead_seconds, 0.5 s) but not yet sent, and the later tasks of "
        "their ordering ids, which wait behind them. Nobody can tell whether such a task "
        "was sent, so it is released again when its lease ends (scheduler_lease_seconds, "
        "300 s by default), like any release whose worker died; the chaos suite checks "
        "that every one runs.",
        "no peer: Celery eta= has no scheduler process of its own to fail over (its schedule "
        "lives in the workers, whose crash is 5b).",
        "worst-hit task = the longest any task due from 2 s before the kill on waited past "
        "max(its due time, the kill): takeover plus working off what fell due meanwhile.",
        f"{runs} run(s), each on a fresh topic and keyspace.",
    ]
    crash = Section("5b", "Crash of the worker holding released tasks")
    hold = float(ctx.pick(6, 20))
    runners: dict[str, tuple[str, Callable[[], Crash]]] = {
        "celery_scheduler": (f"scheduler_lease_seconds = {hold:g}",
                             lambda: _worker_crash(ctx, "celery_scheduler", hold)),
        "Celery eta=": (f"visibility_timeout = {hold:g} s", lambda: _worker_crash(ctx, "Celery eta=", hold)),
        "procrastinate": ("stalled jobs retried once a second", lambda: _procrastinate_crash(ctx)),
    }
    crashes = {system: [runner()] for system, (_, runner) in runners.items()}
    for system, (what, _) in runners.items():
        _crash_rows(crash, system, what, crashes[system])
    for peer in ("Celery eta=", "procrastinate"):
        pairs = list(zip(crashes["celery_scheduler"], crashes[peer], strict=True))
        crash.add(f"celery_scheduler / {peer}: time from the kill until every task ran",
                  Figure.of([ratio(a.recovered, b.recovered) for a, b in pairs], "%", 0))
        crash.add(f"celery_scheduler / {peer}: time until the task the kill cut short ran again",
                  Figure.of([ratio(a.rerun, b.rerun) for a, b in pairs], "%", 0))
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
        f"celery_scheduler re-releases a task whose outcome did not come within its lease "
        f"(default scheduler_lease_seconds 300, here {hold:g}); the released message itself stays "
        "unacknowledged in Redis. Celery eta= waits for the Redis transport to restore unacknowledged "
        f"messages after visibility_timeout (default 3600 s, here {hold:g} s), in sweeps about "
        "every 100 s (kombu's unacked_restore_interval 10 s x unacked_restore_throttle 10, "
        "defaults kept). Both clocks run from delivery (release), not from the kill, so both can "
        "recover sooner after the kill than the lease or timeout. The wait after the "
        "lease/timeout is 15 s for celery_scheduler and "
        f"{ctx.pick(8, 110)} s for Celery eta=.",
        "procrastinate: the same tasks deferred to one worker of concurrency 1 on PostgreSQL, "
        "killed and replaced the same way. Its worker fetches a job per free slot (nothing "
        "prefetched), so it held the one job it was running, which stays 'doing' until the "
        "application retries it: its documentation's recipe, a periodic task calling "
        "get_stalled_jobs (jobs of workers whose heartbeat, sent every 10 s, is 30 s old) and "
        "retry_job, suggested every 10 minutes, here run once a second from the benchmark. "
        "Without it the job never runs again. The wait ends "
        f"{STALLED_WAIT} s after the kill.",
    ]
    return [five, crash]
