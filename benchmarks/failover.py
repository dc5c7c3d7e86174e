"""Scenarios 5 and 5b: a dispatcher killed under load, and a Celery worker killed while it
holds released tasks, beside Celery's own ``eta=``.
"""

from __future__ import annotations

import signal
import threading
import time

from benchmarks.context import Context, feed, utc
from benchmarks.execlog import Start
from benchmarks.harness import stack
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

        fed: list[tuple[float, int]] = []

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


def _worker_crash(ctx: Context, system: str, hold_seconds: float) -> tuple[float, int, int]:
    """Kill the only worker while it holds tasks, start another; return (seconds from the kill
    until every task had started, tasks that never ran, duplicate starts)."""
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
        worker = s.worker(POOL)
        due = time.time() + lead
        for i in range(count):  # distinct ordering ids: all due at once, all released at once
            if ours:
                app.record.schedule((f"crash{i}", i, due, sleep), {}, at=utc(due), wait=False)
            else:
                app.plain.apply_async((f"crash{i}", i, due, sleep), eta=utc(due), queue=s.name)
        if ours:
            from celery_scheduler import flush

            flush(app.app, 60)
        while not s.starts():
            if time.time() > due + 60:
                raise RuntimeError("no task started within 60 s of its due time")
            s.check_alive()
            time.sleep(0.05)
        time.sleep(0.5)
        worker.send_signal(signal.SIGKILL)
        killed = time.time()
        s.worker(POOL)
        s.wait_for_starts(count, timeout=hold_seconds + (15 if ours else ctx.pick(8, 110)),
                          distinct=True)
        starts = s.starts()
    first = first_starts(starts)
    recovered = max(x.started for x in first.values()) - killed if len(first) == count else float("nan")
    return recovered, count - len(first), len(starts) - len(first)


def run(ctx: Context) -> list[Section]:
    five = Section("5", "Failover: SIGKILL one of two dispatchers under load")
    runs = ctx.pick(1, 2)
    results = [_failover(ctx) for _ in range(runs)]
    resumed = Figure.of([r[0] for r in results], "s", 1)
    five.add("release resumed on the survivor after (it leased the last orphaned partition)",
             resumed, "≤ 10 s", resumed.median <= 10)
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
        "lease running out (scheduler_partition_lease_seconds, default 10 s, renewed every third "
        "of it): a survivor may not release before that, or two could release one partition.",
        "no peer: Celery eta= has no scheduler process of its own to fail over (its schedule "
        "lives in the workers, whose crash is 5b).",
        "worst-hit task = the longest any task due from 2 s before the kill on waited past "
        "max(its due time, the kill): takeover plus working off what fell due meanwhile.",
        f"{runs} run(s), each on a fresh topic and keyspace.",
    ]
    crash = Section("5b", "Crash of the Celery worker holding released tasks")
    hold = float(ctx.pick(6, 20))
    recovery: dict[str, list[float]] = {}
    for system, what in (("celery_scheduler", f"scheduler_lease_seconds = {hold:g}"),
                         ("Celery eta=", f"visibility_timeout = {hold:g} s")):
        outcomes = [_worker_crash(ctx, system, hold)]
        recovery[system] = [o[0] for o in outcomes]
        crash.add(f"{system}: every task ran, time from the kill ({what})",
                  Figure.of([o[0] for o in outcomes], "s", 1))
        missing = Figure.of([o[1] for o in outcomes])
        crash.add(f"{system}: tasks that never ran", missing,
                  "0" if system == "celery_scheduler" else "",
                  missing.median == 0 if system == "celery_scheduler" else None)
        crash.add(f"{system}: duplicate executions", Figure.of([o[2] for o in outcomes]))
    crash.add("celery_scheduler / Celery eta=: time from the kill until every task ran",
              Figure.of([ratio(a, b) for a, b in zip(recovery["celery_scheduler"], recovery["Celery eta="],
                                                      strict=True)], "%", 0))
    crash.method = [
        f"{ctx.pick(20, 100)} tasks of 0.1 s on distinct ordering ids, all due at once; one worker "
        f"(--pool={POOL} --concurrency=1, prefetch multiplier 50) holds them; half a second after "
        "the first started it is SIGKILLed and a second worker started. Time = last first start - "
        "kill; n/a when some task never ran within the wait.",
        f"celery_scheduler re-releases a task whose outcome did not come within its lease "
        f"(default scheduler_lease_seconds 300, here {hold:g}); the released message itself stays "
        "unacknowledged in Redis. Celery eta= waits for the Redis transport to restore unacknowledged "
        f"messages after visibility_timeout (default 3600 s, here {hold:g} s), in sweeps about "
        "every 100 s (kombu's unacked_restore_interval 10 s x unacked_restore_throttle 10, "
        "defaults kept). Both clocks run from delivery (release), not from the kill, so both can "
        "recover sooner after the kill than the lease or timeout. The wait after the "
        "lease/timeout is 15 s for celery_scheduler and "
        f"{ctx.pick(8, 110)} s for Celery eta=.",
    ]
    return [five, crash]
