"""Scenario 10: periodic entries (``beat_schedule``) fired by the dispatchers, beside celery
beat and celery-redbeat.

N entries of ``bench.tick``, each a ``crontab()`` (every minute), in the app's
``beat_schedule``: the dispatchers fire them (``scheduler_periodic``), or one ``celery beat``
process with its default scheduler (a shelve file), or ``celery beat -S
redbeat.RedBeatScheduler`` (the entries in Redis, a lock so that one beat of several fires).
Two Celery workers run the runs of every system (with the package's hooks for ours, as its
docs say; Celery as it comes for the peers); each run logs when it started, its entry, and
when its message was sent (``benchmarks.app.tick``), which gives the minute it fired for.

Figures, over the whole minutes of the window: occurrences that ran once, that never ran,
that ran twice or more; how late each occurrence's message was sent (the scheduler's own
part) and how late its run started (with the workers' part, the same for every system).
10b: the same with the scheduler killed mid-run: one of two dispatchers SIGKILLed; celery
beat SIGKILLed and started again after RESTART_AFTER (what a supervisor does); of two
redbeat beats, the one holding the lock SIGKILLed. 10c: a dispatcher's memory with many
entries (once a day, so none fires while it is sampled).

The workers' floor: the same number of runs of the same task queued in Redis before each
minute while the two workers are stopped (SIGSTOP), and continued (SIGCONT) at the minute.
No scheduler can make a run start before the workers take it, so how late these start
bounds every system's "started" figure on this machine, and the workers' CPU per run says
which resource sets it.
"""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass

import psutil

from benchmarks.context import Context
from benchmarks.cpu import CpuMeter, local_services
from benchmarks.harness import APP, Stack, log, stack
from benchmarks.memory import rss_mb
from benchmarks.report import Section
from benchmarks.stats import Figure, percentile

__all__ = ["Firing", "count_firings", "run"]

OURS, BEAT, REDBEAT = "celery_scheduler", "celery beat", "celery-redbeat"
FLOOR = "Celery workers alone, runs queued before the minute"
QUEUED_AHEAD = 30.0  # seconds before the minute the workers stop and the runs are queued
SYSTEMS = (OURS, BEAT, REDBEAT)
WORKERS = 2
CORES = psutil.cpu_count() or 1
RESTART_AFTER = 10.0  # seconds a killed celery beat stays down
MINUTE = 60.0


@dataclass(frozen=True)
class Firing:
    """What N entries firing every minute did over a window of whole minutes."""

    expected: int  # entries x minutes
    once: int
    missed: int
    twice: int  # occurrences that ran more than once
    sent_late: tuple[float, ...]  # message sent minus occurrence, per occurrence that ran (s)
    started_late: tuple[float, ...]  # first start minus occurrence (s)


def count_firings(starts: list[tuple[str, int, float, float, float | None]], entries: int,
                  first_minute: int, last_minute: int) -> Firing:
    """*starts* as (entry, minute, occurrence, started, sent) of runs; the occurrences are
    every entry ``p0`` .. ``p{entries-1}`` at each minute from *first_minute* to
    *last_minute* (minutes since the epoch), both included."""
    runs: Counter[tuple[str, int]] = Counter()
    first: dict[tuple[str, int], tuple[float, float]] = {}
    for name, minute, at, started, sent in starts:
        if not first_minute <= minute <= last_minute:
            continue
        occurrence = (name, minute)
        runs[occurrence] += 1
        late = (started - at, (sent if sent is not None else started) - at)
        if occurrence not in first or late[0] < first[occurrence][0]:
            first[occurrence] = late
    names = [f"p{i}" for i in range(entries)]
    expected = [(name, minute) for minute in range(first_minute, last_minute + 1) for name in names]
    ran = [occurrence for occurrence in expected if runs[occurrence]]
    return Firing(expected=len(expected), once=sum(1 for o in ran if runs[o] == 1),
                  missed=len(expected) - len(ran), twice=sum(1 for o in ran if runs[o] > 1),
                  sent_late=tuple(first[o][1] for o in ran),
                  started_late=tuple(first[o][0] for o in ran))


def _beat(s: Stack, system: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "celery", "-A", APP, "beat", "--loglevel", "INFO",
            "--schedule", str(s.tmp / f"{s.name}-beat-{len(s.processes)}.db")]
    if system == REDBEAT:
        argv += ["--scheduler", "redbeat.RedBeatScheduler"]
    process = s.spawn("beat", argv, {"BENCH_PLAIN_WORKER": "1"})
    s._wait(process, lambda: "beat: Starting..." in s.log_of(process), system, 120)
    return process


def _schedulers(s: Stack, system: str, count: int) -> list[subprocess.Popen[bytes]]:
    if system == OURS:
        return [s.dispatcher() for _ in range(count)]
    if system == BEAT:
        return [_beat(s, system)]  # celery beat must run once: a second would fire everything twice
    return [_beat(s, system) for _ in range(count)]


def _holder(s: Stack, beats: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """The redbeat beat holding the lock: the one that has sent something."""
    for beat in beats:
        if "Sending due task" in s.log_of(beat):
            return beat
    return beats[0]


def _fire(ctx: Context, system: str, entries: int, minutes: int, kill: bool) -> Firing:
    env = {"BENCH_PERIODIC": str(entries)}
    with stack(ctx.tmp, init=system == OURS, env=env, partitions=12) as s:
        for _ in range(WORKERS):
            # ours with the package's worker hooks (install(app) in every process, as the docs
            # say), the peers' as Celery comes
            s.worker("solo", plain=system != OURS)
        schedulers = _schedulers(s, system, 2)
        # the first whole minute at least 45 s after every scheduler is up (a dispatcher
        # writes an occurrence scheduler_periodic_ahead_seconds, 30 s, ahead), and the
        # window's last
        first = math.floor((time.time() + 45) / MINUTE) + 1
        last = first + minutes - 1
        log(f"10 {system}: {entries} entries every minute, minutes {first}..{last}")
        if kill:
            # mid-window, away from a minute's firing: 20 s after the middle minute
            kill_at = (first + minutes // 2) * MINUTE + 20
            time.sleep(max(0.0, kill_at - time.time()))
            victim = schedulers[0] if system != REDBEAT else _holder(s, schedulers)
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            log(f"10b {system}: killed {victim.pid}")
            if system == BEAT:
                time.sleep(RESTART_AFTER)
                _beat(s, system)
        # until the last minute's runs have all started, or 50 s after it
        deadline = (last + 1) * MINUTE + 50
        while time.time() < deadline:
            started = {(x.ordering_id, x.seq) for x in s.starts() if x.seq == last}
            if len(started) >= entries and time.time() > (last + 1) * MINUTE:
                break
            s.check_alive()
            time.sleep(1)
        time.sleep(5)  # room for a second run of the last minute's occurrences
        firing = count_firings([(x.ordering_id, x.seq, x.at, x.started, x.released)
                                for x in s.starts()], entries, first, last)
    log(f"10 {system}: {firing.once} of {firing.expected} ran once, {firing.missed} missed, "
        f"{firing.twice} twice; sent p99 {percentile(firing.sent_late, 99):.3f}s, started p99 "
        f"{percentile(firing.started_late, 99):.3f}s")
    return firing


@dataclass(frozen=True)
class Floor:
    """The workers' part alone: the runs, and the workers' CPU while they took them."""

    firing: Firing
    cpu_ms_per_run: float  # the workers' CPU seconds from the minute until the runs started
    busy: float  # the machine's busy share of its cores over the same windows (0..1)


def _floor(ctx: Context, entries: int, minutes: int) -> Floor:
    with stack(ctx.tmp, init=False) as s:
        bench = s.use_client()
        workers = [s.worker("solo", plain=True) for _ in range(WORKERS)]
        meter = CpuMeter({"workers": [w.pid for w in workers], **local_services()})
        first = math.floor((time.time() + QUEUED_AHEAD + 15) / MINUTE) + 1
        last = first + minutes - 1
        log(f"10 floor: {entries} runs queued before each of minutes {first}..{last}")
        cpu, busy, wall = 0.0, 0.0, 0.0
        for minute in range(first, last + 1):
            at = minute * MINUTE
            time.sleep(max(0.0, at - QUEUED_AHEAD - time.time()))
            for worker in workers:
                worker.send_signal(signal.SIGSTOP)
            try:
                with bench.app.connection_for_write() as connection:
                    for i in range(entries):
                        bench.tick.apply_async((f"p{i}",), {"at": at}, queue=s.name,
                                               connection=connection)
                if time.time() > at:
                    raise RuntimeError(f"queuing {entries} runs took more than "
                                       f"{QUEUED_AHEAD:.0f} s")
                time.sleep(at - time.time())
                meter.start()
            finally:
                for worker in workers:
                    worker.send_signal(signal.SIGCONT)
            deadline = at + 50
            while time.time() < deadline:
                if len({x.ordering_id for x in s.starts() if x.seq == minute}) >= entries:
                    break
                s.check_alive()
                time.sleep(0.5)  # reading the log costs the workers' cores too: not too often
            use = meter.stop()
            cpu += use.seconds["workers"]
            busy += use.busy * use.wall
            wall += use.wall
        firing = count_firings([(x.ordering_id, x.seq, x.at, x.started, x.released)
                                for x in s.starts()], entries, first, last)
    floor = Floor(firing, 1000 * cpu / max(1, firing.once + firing.twice), busy / wall if wall else 0.0)
    log(f"10 floor: started p99 {percentile(firing.started_late, 99):.3f}s, workers' CPU "
        f"{floor.cpu_ms_per_run:.2f} ms a run, machine {100 * floor.busy:.0f}% busy")
    return floor


def _floor_rows(section: Section, floor: Floor, entries: int) -> None:
    firing = floor.firing
    section.add(f"{FLOOR}: runs started / queued",
                Figure.of([(firing.once + firing.twice) / firing.expected if firing.expected
                           else math.nan], "%", 2))
    section.add(f"{FLOOR}: run started after the minute, p99",
                Figure.of([percentile(firing.started_late, 99)], "s", 3))
    section.add(f"{FLOOR}: run started after the minute, max",
                Figure.of([max(firing.started_late, default=math.nan)], "s", 3))
    section.add(f"{FLOOR}: workers' CPU per run", Figure.of([floor.cpu_ms_per_run], "ms", 2))
    section.add(f"{FLOOR}: machine CPU busy (all {CORES} cores) while they ran",
                Figure.of([floor.busy], "%"))
    section.add(f"{FLOOR}: {entries:,} runs x the workers' CPU per run / {CORES} cores",
                Figure.of([entries * floor.cpu_ms_per_run / 1000 / CORES], "s", 2))


def _rows(section: Section, system: str, firing: Firing, judge: bool, peers: dict[str, Firing]
          ) -> None:
    ours = system == OURS
    section.add(f"{system}: occurrences run once / expected",
                Figure.of([firing.once / firing.expected if firing.expected else math.nan], "%", 2),
                "100%" if ours else "", firing.once == firing.expected if ours and judge else None)
    section.add(f"{system}: occurrences never run", Figure.of([firing.missed]),
                "0" if ours else "", firing.missed == 0 if ours and judge else None)
    section.add(f"{system}: occurrences run twice or more", Figure.of([firing.twice]),
                "0" if ours else "", firing.twice == 0 if ours and judge else None)
    section.add(f"{system}: message sent after the occurrence, p99",
                Figure.of([percentile(firing.sent_late, 99)], "s", 3))
    started = percentile(firing.started_late, 99)
    target, met = "", None
    if ours and judge:
        bound = min([1.0, *(percentile(p.started_late, 99) for p in peers.values())])
        target = "≤ 1 s and ≤ each peer's"
        met = started <= bound
    section.add(f"{system}: run started after the occurrence, p99", Figure.of([started], "s", 3),
                target, met)
    section.add(f"{system}: run started after the occurrence, max",
                Figure.of([max(firing.started_late, default=math.nan)], "s", 3))


def _memory(ctx: Context, entries: int) -> float:
    hour = (time.gmtime().tm_hour + 12) % 24  # none fires while sampled
    env = {"BENCH_PERIODIC": str(entries), "BENCH_PERIODIC_HOUR": str(hour)}
    with stack(ctx.tmp, env=env) as s:
        dispatcher = s.dispatcher()
        deadline = time.monotonic() + 300
        while "firing" not in s.log_of(dispatcher) and time.monotonic() < deadline:
            time.sleep(1)
        time.sleep(20)  # the entries read and planned
        peak = 0.0
        for _ in range(20):
            peak = max(peak, rss_mb(dispatcher.pid))
            time.sleep(0.5)
        s.check_alive()
    log(f"10c: dispatcher with {entries} entries: {peak:.0f} MB")
    return peak


def run(ctx: Context) -> list[Section]:
    entries, minutes = ctx.pick(500, 10_000), ctx.pick(2, 10)
    kill_minutes = ctx.pick(3, 5)
    ten = Section("10", "Periodic entries every minute, beside celery beat and celery-redbeat")
    ten_b = Section("10b", "Periodic entries with the scheduler killed mid-run")
    firings: dict[str, Firing] = {}
    killed: dict[str, Firing] = {}
    errors: list[str] = []
    for system in SYSTEMS:
        for kill, into in ((False, firings), (True, killed)):
            try:
                into[system] = _fire(ctx, system, entries, kill_minutes if kill else minutes, kill)
            except Exception as exc:
                errors.append(f"{system}{' (killed)' if kill else ''}: {type(exc).__name__}: {exc}"[:500])
    floor_minutes = ctx.pick(1, 3)
    try:
        floor: Floor | None = _floor(ctx, entries, floor_minutes)
    except Exception as exc:
        floor = None
        errors.append(f"workers alone: {type(exc).__name__}: {exc}"[:500])
    for system, firing in firings.items():
        _rows(ten, system, firing, not ctx.quick, {k: v for k, v in firings.items() if k != system})
    if floor is not None:
        _floor_rows(ten, floor, entries)
    for system, firing in killed.items():
        _rows(ten_b, system, firing, not ctx.quick, {k: v for k, v in killed.items() if k != system})
    ten.method = [
        f"{entries} entries of one task, each crontab() (every minute), in the app's beat_schedule; "
        f"{minutes} whole minutes are counted, from the first after the schedulers started. "
        "celery_scheduler: two dispatchers (scheduler_periodic = True, every other setting at "
        "its default: occurrences written scheduler_periodic_ahead_seconds, 30 s, ahead); "
        "celery beat: one beat "
        "(a second would fire every entry twice), its default PersistentScheduler; "
        "celery-redbeat: two beats with RedBeatScheduler, one holding its Redis lock.",
        f"the runs go to {WORKERS} Celery workers (solo pool) on Redis: celery_scheduler's with "
        "its worker hooks (periodic_tasks.install in every process, as its docs say), the peers' "
        "as Celery comes. Each run logs when it started and when its message was sent (a "
        "before_task_publish stamp, in the beat or the dispatcher), which names the minute it "
        "fired for; an occurrence is the entry and that minute.",
        "sent after the occurrence is the scheduler's own part; started after it adds the broker "
        "and the workers, who take the minute's runs one after another. One run per system.",
        f"{FLOOR}: the workers' floor. {WORKERS} workers as the peers' (Celery as it comes), "
        f"stopped with SIGSTOP {QUEUED_AHEAD:.0f} s before each of {floor_minutes} minutes while "
        f"the minute's {entries} runs of the same task are queued in Redis, continued with "
        "SIGCONT at the minute; started after the minute as above, and the workers' CPU from the "
        "minute until the minute's runs had all started. No scheduler can start a run before "
        "the workers take it: this bounds every system's started figure on this machine.",
    ]
    ten_b.method = [
        f"as 10 with {kill_minutes} minutes counted; 20 s after the middle minute's occurrences, "
        f"one of the two dispatchers is SIGKILLed; celery beat is SIGKILLed and started again "
        f"{RESTART_AFTER:.0f} s later (as a supervisor would); of the two redbeat beats, the one "
        "holding the lock is SIGKILLed (the other takes the lock when it expires).",
    ]
    if errors:
        ten.error = "; ".join(errors)
    sections = [ten, ten_b]
    many = ctx.pick(10_000, 100_000)
    ten_c = Section("10c", "A dispatcher's memory with many periodic entries")
    try:
        peak = _memory(ctx, many)
        ten_c.add(f"dispatcher resident memory with {many:,} entries", Figure.of([peak], "MB"),
                  "≤ 200 MB" if not ctx.quick else "", peak <= 200 if not ctx.quick else None)
    except Exception as exc:
        ten_c.error = f"{type(exc).__name__}: {exc}"[:500]
    ten_c.method = [f"{many:,} entries, each once a day at an hour twelve hours away (none fires "
                    "while sampled); one dispatcher owning every partition; its peak resident "
                    "memory (with its children) over 10 s, 20 s after it began firing."]
    sections.append(ten_c)
    return sections
