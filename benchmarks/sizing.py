"""BENCHMARKS.md's Sizing section: the cores a steady rate asks of each part, derived run by
run from the CPU per task that scenario 6 (the backlog drain) measured, so that
docs/production.md quotes figures a report holds rather than sums made by hand.

The drain keeps every part busy and working in batches: it is the cheapest a task gets on
this machine. A light load costs more a task (scenario 3b), replication 3 costs Kafka and
Cassandra more than the replication 1 measured here, and each figure moves with the CPU's
speed; the section's notes say so beside the figures.
"""

from __future__ import annotations

import math

from benchmarks.report import Section
from benchmarks.stats import Figure

__all__ = ["PARTS", "RATES", "derive", "derived"]

# The parts a deployment sizes, as scenario 6's rows name them, and the rates sized for.
PARTS = ("dispatcher", "Kafka", "Cassandra", "Redis", "workers")
RATES = (1_000, 10_000, 100_000)
OURS, ALONE = "celery_scheduler", "Celery alone"


def _per_run(figure: Figure, convert: float, unit: str, digits: int, *, inverse: bool = False) -> Figure:
    values = []
    for ms in figure.values:
        if math.isnan(ms) or ms <= 0:
            values.append(math.nan)
        else:
            values.append(convert / ms if inverse else convert * ms)
    return Figure.of(values, unit, digits)


def derive(sections: list[Section]) -> Section | None:
    """The Sizing section from *sections* (a report's), or None without scenario 6's CPU rows."""
    rows = {row.what: row.figure for section in sections if section.number == "6" for row in section.rows}
    costs = {part: rows[f"{OURS}: CPU per task, {part}"] for part in PARTS
             if f"{OURS}: CPU per task, {part}" in rows}
    if not costs:
        return None
    sizing = Section("S", "Sizing: what a steady rate asks of each part (derived from scenario 6)")
    for part, cost in costs.items():
        sizing.add(f"{part}: CPU per task in the drain", cost)
        sizing.add(f"{part}: tasks a second one core carries", _per_run(cost, 1000.0, "tasks/s", 0,
                                                                        inverse=True))
        for rate in RATES:
            sizing.add(f"{part}: cores for {rate:,} tasks/s", _per_run(cost, rate / 1000, "cores", 1))
    alone = rows.get(f"{ALONE}: CPU per task, workers")
    if alone is not None:
        sizing.add("Celery alone's workers, the same tasks: CPU per task", alone)
        sizing.add("Celery alone's workers: cores for 10,000 tasks/s", _per_run(alone, 10.0, "cores", 1))
    sizing.method = [
        "derived run by run from scenario 6's CPU per task of each part (a drain of overdue "
        "tasks: every part busy, working in batches), at the replication the run used (its "
        "Durability table): one core carries 1000 / (ms a task) tasks a second, and a rate asks "
        "rate x (ms a task) / 1000 cores. The workers' figure is Celery's own work plus the "
        "outcome report, before the task's own work.",
        "the cheapest a task gets here: at a light load each task costs more (scenario 3b), "
        "Kafka and Cassandra at replication 3 write each task to three replicas (not measured "
        "in this section), and every figure moves with the CPU's speed (the speed probe). Plan "
        "headroom: below about 60% of a machine's cores at the peak rate (docs/production.md).",
    ]
    return sizing


def derived(sections: list[Section]) -> list[Section]:
    """The sections BENCHMARKS.md derives from *sections* (what ``render`` is given)."""
    sizing = derive(sections)
    return [] if sizing is None else [sizing]
