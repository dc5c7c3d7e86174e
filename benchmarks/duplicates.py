"""Scenario 9: the same task scheduled twice, beside the peers: does it run once?

Every task is scheduled twice, back to back, while it waits: by each system's own notion of
which task it is (``lateness.systems``): our uniqueness key, procrastinate's queueing lock,
the Celery task id for Celery ``eta=`` and celery-longterm-scheduler, the RQ job id.

9b: tasks scheduled once, due later than the Redis transport's visibility timeout: Celery
``eta=`` holds each in a worker, unacknowledged, and the transport gives it to a worker
again once the timeout passed, so it runs twice; the scheduler holds nothing in a worker.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.context import Context, utc
from benchmarks.harness import log, stack
from benchmarks.lateness import LONGTERM, PROCRASTINATE, SYSTEMS, systems
from benchmarks.report import Section
from benchmarks.stats import Figure

__all__ = ["Twice", "count_runs", "run"]

FIRST_SEQ = 50_000_000  # clear of the seqs other scenarios use on the same kind of stack
RUNS = 3  # of each system, in turn (full runs)
# how each system knows the second call is the same task
IDENTITY = {"celery_scheduler": "same uniqueness key", "Celery eta=": "same task_id",
            "RQ enqueue_at": "same job_id", PROCRASTINATE: "same queueing_lock",
            LONGTERM: "same task_id"}


@dataclass(frozen=True)
class Twice:
    tasks: int  # distinct tasks, each scheduled twice
    ran: int  # distinct tasks that ran
    extra: int  # runs beyond the first of each task

    @property
    def missing(self) -> int:
        return self.tasks - self.ran


def count_runs(seqs: list[int], first: int, tasks: int) -> Twice:
    """Runs of the tasks *first* .. *first + tasks - 1* among the started *seqs*."""
    runs = Counter(seq for seq in seqs if first <= seq < first + tasks)
    return Twice(tasks, len(runs), sum(runs.values()) - len(runs))


def _twice(ctx: Context, system: str, tasks: int, lead: float, settle: float) -> Twice:
    with systems(ctx, system) as (s, publish, flush):
        due = time.time() + lead
        for i in range(tasks):
            at = due + i / tasks  # spread over one second
            publish(FIRST_SEQ + i, at)
            publish(FIRST_SEQ + i, at)
        flush()
        s.wait_for_starts(tasks, timeout=lead + 1 + settle, distinct=True)
        time.sleep(2)  # room for a second run of the last tasks to show
        outcome = count_runs([x.seq for x in s.starts()], FIRST_SEQ, tasks)
    log(f"{system}: {outcome.ran} of {tasks} ran, {outcome.extra} extra run(s)")
    return outcome


# 9b: Celery's default pool, the one whose event loop restores unacknowledged Redis messages
POOL = "prefork"
BEYOND_WORKERS = 2


def _beyond_visibility(ctx: Context, system: str, tasks: int, visibility: float, delay: float,
                       settle: float) -> Twice:
    """*tasks* scheduled once each, due from *delay* s ahead, on a Redis transport whose
    visibility timeout is *visibility* s; how many ran, and how many ran again."""
    ours = system == "celery_scheduler"
    env = {"BENCH_VISIBILITY_TIMEOUT": str(visibility)}
    with stack(ctx.tmp, init=ours, env=env) as s:
        app = s.use_client()
        if ours:
            s.dispatcher()
        for _ in range(BEYOND_WORKERS):
            s.worker(POOL, plain=not ours)
        due = time.time() + delay
        for i in range(tasks):
            at = due + 10 * i / tasks  # spread over ten seconds
            args = (f"o{i}", FIRST_SEQ + i, at)
            if ours:
                app.record.schedule(args, {}, at=utc(at), wait=False)
            else:
                app.plain.apply_async(args, eta=utc(at), queue=s.name)
        if ours:
            from celery_scheduler import flush

            flush(app.app, 60)
        s.wait_for_starts(tasks, timeout=delay + 10 + settle, distinct=True)
        time.sleep(settle)  # room for the second runs the restores bring
        outcome = count_runs([x.seq for x in s.starts()], FIRST_SEQ, tasks)
    log(f"9b {system}: {outcome.ran} of {tasks} ran, {outcome.extra} extra run(s)")
    return outcome


def _nine_b(ctx: Context) -> Section:
    tasks = ctx.pick(20, 200)
    visibility, delay, settle = ctx.pick(5, 10), ctx.pick(20, 130), ctx.pick(10, 30)
    section = Section("9b", "Due beyond the Redis visibility timeout: runs per task")
    errors: list[str] = []
    outcomes = _rounds(ctx, ("celery_scheduler", "Celery eta="),
                       lambda system: _beyond_visibility(ctx, system, tasks, visibility, delay,
                                                         settle), errors)
    for system, runs in outcomes.items():
        _add(section, system, system, runs)
    if errors:
        section.error = "; ".join(errors)
    section.method = [
        f"{tasks} tasks, each scheduled once, due over ten seconds from {delay} s ahead, on the "
        f"Redis broker with a visibility timeout of {visibility} s (kombu's default is 3,600 s: "
        f"the same happens to a task due more than an hour ahead), {BEYOND_WORKERS} workers of "
        f"Celery's default pool (prefork, concurrency 1; its event loop is what restores "
        "unacknowledged messages, in sweeps spaced by kombu's unacked_restore_interval and "
        "throttle). Celery eta=: apply_async(eta=...), the worker holds each task "
        "unacknowledged until it is due. celery_scheduler: the same calls through "
        "schedule(..., wait=False), one dispatcher.",
        f"waiting ends when every task ran once (or {delay + 10 + settle} s after scheduling), "
        f"then {settle} s more for second runs; runs are counted from the execution log. "
        f"{ctx.pick(1, RUNS)} run(s) per system, the two in turn.",
    ]
    return section


def _rounds(ctx: Context, systems_: tuple[str, ...], trial: Callable[[str], Twice],
            errors: list[str]) -> dict[str, list[Twice]]:
    """*trial* of each of *systems_*, in turn, ``RUNS`` rounds (A B A B: a machine that
    slows down in the middle of the group weighs on every system); a system that failed once
    is not tried again."""
    outcomes: dict[str, list[Twice]] = {system: [] for system in systems_}
    failed: set[str] = set()
    for _ in range(ctx.pick(1, RUNS)):
        for system in systems_:
            if system in failed:
                continue
            try:
                outcomes[system].append(trial(system))
            except Exception as exc:
                errors.append(f"{system}: {type(exc).__name__}: {exc}"[:500])
                failed.add(system)
    return {system: runs for system, runs in outcomes.items() if runs}


def _add(section: Section, system: str, label: str, runs: list[Twice]) -> None:
    ours = system == "celery_scheduler"
    extra = Figure.of([outcome.extra for outcome in runs])
    section.add(f"{label}: runs beyond the first", extra, "0 in every run" if ours else "",
                all(outcome.extra == 0 for outcome in runs) if ours else None)
    section.add(f"{system}: tasks that never ran", Figure.of([outcome.missing for outcome in runs]))


def run(ctx: Context) -> list[Section]:
    tasks, lead, settle = ctx.pick(100, 1000), ctx.pick(4, 6), ctx.pick(15, 20)
    nine = Section("9", "The same task scheduled twice")
    errors: list[str] = []
    outcomes = _rounds(ctx, SYSTEMS, lambda system: _twice(ctx, system, tasks, lead, settle),
                       errors)
    for system, runs in outcomes.items():
        _add(nine, system, f"{system} ({IDENTITY[system]})", runs)
    nine.method = [
        f"{tasks} tasks due over one second from {lead} s ahead, each scheduled twice back to back "
        "while it waits, by each system's own key: celery_scheduler the uniqueness key (the second "
        "call is dropped at ingest); procrastinate queueing_lock (the second defer raises "
        "AlreadyEnqueued, which the publisher ignores); celery-longterm-scheduler and Celery eta= "
        "the same Celery task_id; RQ the same job_id. Neither celery-longterm-scheduler nor RQ "
        "documents this as deduplication: a second call with the same id overwrites the stored "
        "one, so it holds only while the first is still waiting.",
        f"waiting ends when every task ran once (or {lead + 1 + settle} s after scheduling), then "
        "2 s more for any second run; runs are counted from the execution log.",
        f"the same processes as 3 and 3b; {ctx.pick(1, RUNS)} run(s) per system, the systems in "
        "turn each round.",
    ]
    if errors:
        nine.error = "; ".join(errors)
    try:
        nine_b = _nine_b(ctx)
    except Exception as exc:
        nine_b = Section("9b", "Due beyond the Redis visibility timeout: runs per task",
                         error=f"{type(exc).__name__}: {exc}"[:500])
    return [nine, nine_b]
