"""Scenario 9: the same task scheduled twice, beside the peers: does it run once?

Every task is scheduled twice, back to back, while it waits: by each system's own notion of
which task it is (``lateness.systems``): our uniqueness key, procrastinate's queueing lock,
the Celery task id for Celery ``eta=`` and celery-longterm-scheduler, the RQ job id.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

from benchmarks.context import Context
from benchmarks.harness import log
from benchmarks.lateness import LONGTERM, PROCRASTINATE, SYSTEMS, systems
from benchmarks.report import Section
from benchmarks.stats import Figure

__all__ = ["Twice", "count_runs", "run"]

FIRST_SEQ = 50_000_000  # clear of the seqs other scenarios use on the same kind of stack
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


def run(ctx: Context) -> list[Section]:
    tasks, lead, settle = ctx.pick(100, 1000), ctx.pick(4, 6), ctx.pick(15, 20)
    nine = Section("9", "The same task scheduled twice")
    errors = []
    for system in SYSTEMS:
        try:
            outcome = _twice(ctx, system, tasks, lead, settle)
        except Exception as exc:
            errors.append(f"{system}: {type(exc).__name__}: {exc}"[:500])
            continue
        ours = system == "celery_scheduler"
        extra = Figure.of([outcome.extra])
        nine.add(f"{system} ({IDENTITY[system]}): runs beyond the first", extra,
                  "0" if ours else "", extra.median == 0 if ours else None)
        nine.add(f"{system}: tasks that never ran", Figure.of([outcome.missing]))
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
        "the same processes as 3 and 3b, one run per system.",
    ]
    if errors:
        nine.error = "; ".join(errors)
    return [nine]
