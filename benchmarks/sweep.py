"""Scenario 3c: the highest steady due rate each system keeps punctual on this machine, and
lateness at a rate both celery_scheduler and Celery ``eta=`` hold.

Scenario 3's load (task i due at ``t0 + i / rate``, published a few seconds before it is
due, 1,000 ordering ids, two solo workers) at rates on a grid of 50 a second, chosen by
bisection: a rate is *punctual* when its run was published on time, at least 99% of its tasks
ran by the deadline and their lateness p99 was at most 100 ms; a punctual rate is taken to
make every lower one punctual. Each repetition runs every system once, in an order rotated
from one repetition to the next, so that the ratios are taken pair by pair between runs close
in time. A run that leaves a backlog it cannot work off within a minute or two ends its
system's processes; the next rate starts on new ones (a backlog would make it late for
reasons of the rate before). See :mod:`benchmarks.capacity` for a sweep over chosen rates
with the CPU each part took.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from benchmarks.capacity import PUNCTUAL_MS, punctual
from benchmarks.context import Context
from benchmarks.harness import Stack, log
from benchmarks.lateness import (
    PROCRASTINATE,
    PUBLISHER_THREADS,
    SYSTEMS,
    WARM_UP_SEQ,
    Load,
    Outcome,
    measure,
    systems,
)
from benchmarks.report import Section
from benchmarks.stats import Figure, ratio

__all__ = ["Sweep", "punctual", "run"]

OURS, ETA = SYSTEMS[0], SYSTEMS[1]
SWEPT = (OURS, ETA, "RQ enqueue_at", PROCRASTINATE)
STEP = 50
LOWEST, HIGHEST = 100, 1000
BOTH_HOLD = 250  # a rate both ours and Celery eta= keep punctual (the example)
LEAD_SECONDS = 5.0
DRAIN_SECONDS = 120.0  # after a run that was not punctual, how long its backlog may take


@dataclass
class Sweep:
    """Bisection over *grid* (rising rates) for the highest punctual rate.

    ``next()`` names the rate to run next (None once the answer is known), ``record()`` takes
    whether it was punctual. ``highest`` is the answer: a rate of the grid, or 0 when even the
    lowest was not punctual."""

    grid: Sequence[int]
    good: int = field(default=-1, init=False)  # the highest rate found punctual (-1: none)
    bad: int = field(init=False)  # the lowest rate found not punctual (len(grid): none)
    tried: list[tuple[int, bool]] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.bad = len(self.grid)

    def next(self) -> int | None:
        if self.bad - self.good <= 1:
            return None
        return self.grid[(self.good + self.bad) // 2]

    def record(self, rate: int, was_punctual: bool) -> None:
        index = self.grid.index(rate)
        self.tried.append((rate, was_punctual))
        if was_punctual:
            self.good = max(self.good, index)
        else:
            self.bad = min(self.bad, index)
        if self.good >= self.bad:
            raise ValueError(f"{self.grid[self.good]}/s was punctual and {self.grid[self.bad]}/s "
                             f"not: the sweep assumes a rate that is punctual makes every lower "
                             f"one so")

    @property
    def highest(self) -> int:
        return self.grid[self.good] if self.good >= 0 else 0

    def said(self) -> str:
        return ", ".join(f"{rate} {'yes' if ok else 'no'}" for rate, ok in self.tried)


def _drained(s: Stack, first_seq: int, total: int, timeout: float) -> bool:
    """Wait until every task of the run from *first_seq* started; False after *timeout*."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len({x.seq for x in s.starts() if first_seq <= x.seq < first_seq + total}) >= total:
            return True
        s.check_alive()
        time.sleep(1.0)
    return False


@dataclass
class SystemRun:
    sweep: Sweep
    at_both: Outcome | None  # the run at BOTH_HOLD (ours and Celery eta= only)
    fresh_starts: int = 0  # times the system's processes were started anew after a backlog


def _run(ctx: Context, system: str, grid: Sequence[int], duration: float, grace: float,
         warm: Load) -> SystemRun:
    threads = 1 if system == OURS else PUBLISHER_THREADS
    result = SystemRun(Sweep(grid), None)
    seq = 10_000_000
    while result.sweep.next() is not None or (result.at_both is None and system in (OURS, ETA)):
        with systems(ctx, system) as (s, publish, flush):
            measure(s, publish, flush, warm, WARM_UP_SEQ, threads)
            if result.at_both is None and system in (OURS, ETA):
                load = Load(rate=BOTH_HOLD, duration=duration, lead=LEAD_SECONDS, grace=grace)
                result.at_both = measure(s, publish, flush, load, seq, threads)
                seq += 10_000_000
            while (rate := result.sweep.next()) is not None:
                load = Load(rate=rate, duration=duration, lead=LEAD_SECONDS, grace=grace)
                outcome = measure(s, publish, flush, load, seq, threads)
                result.sweep.record(rate, punctual(outcome))
                drained = _drained(s, seq, outcome.expected, DRAIN_SECONDS)
                seq += 10_000_000
                if not drained:
                    result.fresh_starts += 1
                    break
    log(f"3c: {system}: highest punctual rate {result.sweep.highest}/s ({result.sweep.said()})")
    return result


def run(ctx: Context) -> list[Section]:
    runs = ctx.pick(1, 3)
    duration, grace = ctx.pick(3, 20), ctx.pick(6, 10)
    grid = list(range(LOWEST, HIGHEST + 1, STEP))
    warm = Load(rate=100, duration=ctx.pick(2, 10), lead=LEAD_SECONDS, grace=grace)
    chosen = SWEPT[:2] if ctx.quick else SWEPT
    results: dict[str, list[SystemRun]] = {system: [] for system in chosen}
    for repetition in range(runs):
        turn = repetition % len(chosen)
        for system in (*chosen[turn:], *chosen[:turn]):
            results[system].append(_run(ctx, system, grid, duration, grace, warm))
    section = Section("3c", f"The highest due rate kept punctual (p99 ≤ {PUNCTUAL_MS:g} ms), "
                            f"{STEP}/s steps")
    for system, found in results.items():
        section.add(f"{system}: highest punctual due rate", Figure.of(
            [r.sweep.highest for r in found], "/s"), note="; ".join(
            f"run {n}: {r.sweep.said()}" + (f" ({r.fresh_starts} fresh start(s))"
                                            if r.fresh_starts else "")
            for n, r in enumerate(found, 1)))
    ours, eta = results[OURS], results[ETA]
    shares = Figure.of([ratio(a.sweep.highest, b.sweep.highest) if b.sweep.highest else math.nan
                        for a, b in zip(ours, eta, strict=True)], "%", 0)
    section.add(f"{OURS} / {ETA}: highest punctual rate, run by run", shares,
                "≥ 100% in every run", shares.low >= 1 if len(shares.measured) == len(ours) else None)
    both = [(a.at_both, b.at_both) for a, b in zip(ours, eta, strict=True)
            if a.at_both is not None and b.at_both is not None]
    for system, pick in ((OURS, 0), (ETA, 1)):
        section.add(f"{system}: lateness p99 at {BOTH_HOLD}/s",
                    Figure.of([pair[pick].ms(99) for pair in both], "ms", 1))
    over = Figure.of([ratio(a.ms(99), b.ms(99)) if a.valid and b.valid and b.ms(99) > 0 else math.nan
                      for a, b in both], "x", 1)
    section.add(f"{OURS} / {ETA}: lateness p99 at {BOTH_HOLD}/s, run by run", over,
                "≤ 2x in every run", over.high <= 2 if len(over.measured) == len(both) else None)
    section.method = [
        f"scenario 3's load (1,000 ordering ids, published {LEAD_SECONDS:g} s ahead, two solo "
        f"workers; celery_scheduler with one dispatcher, publishing in its batched form from one "
        f"thread, the peers from {PUBLISHER_THREADS} threads) for {duration:g} s a rate, each "
        f"run waiting {grace:g} s after its last due time.",
        f"punctual: the run's load published on time (else it is not punctual either, and its "
        f"note says which rates were run), ≥ 99% of its tasks run by then, lateness p99 ≤ "
        f"{PUNCTUAL_MS:g} ms. Rates from {LOWEST} to {HIGHEST}/s in steps of {STEP}, chosen by "
        f"bisection; 0 means not even {LOWEST}/s. The note lists each run's rates in the order "
        f"run.",
        f"{runs} repetition(s), each running every system once in an order rotated by one from "
        f"the repetition before; ratios pair a repetition's runs. After a run that was not "
        f"punctual, its tasks are waited for up to {DRAIN_SECONDS:g} s; a backlog left after "
        f"that ends the system's processes and the next rate starts on new ones.",
        f"at {BOTH_HOLD}/s: one run of ours and Celery eta='s each repetition, before the sweep, "
        f"on the same processes.",
    ]
    return [section]
