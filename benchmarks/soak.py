"""Scenario 11: a soak. An hour of 200 due tasks a second: does the dispatcher hold its
memory and its punctuality?

One dispatcher and two solo Celery workers, scenario 3's load (1,000 ordering ids, each task
published a few seconds before it is due) in windows of ten minutes, one after the other
(each waits for its stragglers, so a few seconds pass between them). After each window, the
dispatcher's resident memory (with its children) and the window's lateness percentiles. A
dispatcher that kept something of every task (a set of keys never pruned, a cache without a
bound) grows from window to window; the first window, in which caches fill, is the base.
"""

from __future__ import annotations

from benchmarks.context import Context
from benchmarks.harness import log
from benchmarks.lateness import WARM_UP_SEQ, Load, Outcome, measure, parts_of, systems
from benchmarks.memory import rss_mb
from benchmarks.report import Section
from benchmarks.stats import Figure

__all__ = ["run"]

RATE = 200
WINDOW_SECONDS = 600
WINDOWS = 6
GROWTH_TARGET = 0.10  # the bound: RSS growth over the hour
FIRST_SEQ = 50_000_000  # each window's seqs from here on, 10,000,000 apart


def growth(rss: list[float]) -> float:
    """RSS growth from the end of the first window to the largest after it (a fraction)."""
    return max(rss[1:], default=rss[0]) / rss[0] - 1


def run(ctx: Context) -> list[Section]:
    windows, seconds = ctx.pick(2, WINDOWS), ctx.pick(20, WINDOW_SECONDS)
    load = Load(rate=RATE, duration=seconds, lead=5, grace=ctx.pick(10, 30))
    warm = Load(rate=RATE, duration=ctx.pick(2, 10), lead=load.lead, grace=load.grace)
    section = Section("11", f"Soak: {RATE} due tasks/s for {windows * seconds / 60:g} min")
    outcomes: list[Outcome] = []
    rss: list[float] = []
    with systems(ctx, "celery_scheduler") as (s, publish, flush):
        [dispatcher] = parts_of(s)["dispatcher"]
        measure(s, publish, flush, warm, WARM_UP_SEQ)
        for window in range(windows):
            outcomes.append(measure(s, publish, flush, load, FIRST_SEQ + window * 10_000_000))
            rss.append(rss_mb(dispatcher))
            log(f"11: window {window + 1} of {windows}: p99 {outcomes[-1].ms(99):.1f} ms, "
                f"dispatcher RSS {rss[-1]:.0f} MB")
    minutes = seconds / 60
    for window, (outcome, mb) in enumerate(zip(outcomes, rss, strict=True)):
        span = f"minutes {window * minutes:g}-{(window + 1) * minutes:g}"
        section.add(f"{span}: lateness p99", Figure.of([outcome.ms(99)], "ms", 1))
        section.add(f"{span}: dispatcher RSS at the end", Figure.of([mb], "MB"))
    grew = growth(rss)
    section.add("dispatcher RSS growth after the first window", Figure.of([grew], "%", 1),
                f"≤ {GROWTH_TARGET:.0%}", grew <= GROWTH_TARGET)
    p99s = Figure.of([o.ms(99) for o in outcomes], "ms", 1)
    section.add("lateness p99 of the windows (lowest to highest)", p99s)
    section.add("tasks run by the deadline, every window", Figure.of([o.ran for o in outcomes], "%", 1),
                "≥ 99% in every window", min(o.ran for o in outcomes) >= 0.99)
    section.method = [
        f"celery_scheduler with one dispatcher and two solo workers (scenario 3's set-up), "
        f"{RATE} due tasks/s over 1,000 ordering ids, each published {load.lead:g} s ahead, in "
        f"{windows} windows of {minutes:g} min one after the other after an unmeasured "
        f"{warm.duration:g} s run; each window waits up to {load.grace:g} s for its last tasks.",
        "lateness as in 3 (first start minus due time), per window; the dispatcher's resident "
        "memory with its children (psutil) after each window. Growth is from the first "
        "window's end to the largest after it. One run (an hour).",
    ]
    return [section]
