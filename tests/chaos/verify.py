"""Check a chaos run against the guarantees, from the independent execution log alone.

The rules (each run of a task writes ``start`` and ``end`` lines; a *key* is an
(ordering id, seq) pair, one schedule call):

- **lost**: the schedule call returned successfully ("accepted"), no cancel of it was
  accepted, and the key never started. A key whose cancel was accepted must either have been
  cancelled (store status ``cancelled``) or have run (the cancel came after its release);
  anything else is lost too. A call that raised is not accepted and never counts as lost.
- **early**: a key's first start is more than 1 ms before its scheduled time (the key
  stores milliseconds).
- **order violation**: within one ordering id, the *first* starts of the keys that ran are
  not in seq order (seq order is schedule order, and scheduled times rise with seq).
- **overlap**: two runs of one ordering id (any runs, duplicates included) overlap in time.
  A run with no ``end`` ended when its worker was SIGKILLed; a run with no end in a live
  worker counts as still running at the end of the run.
- **duplicate**: a second or later start of a key; reported with how many started after a
  later key of the same ordering id had already started ("late duplicates"), which is
  allowed (at least once) but worth watching.
- **cancelled but ran**: a key whose cancel was accepted and whose store status is
  ``cancelled`` has a start in the log.
- **lateness**: first start minus scheduled time, over all keys that ran; "during faults"
  are keys due between a fault's injection and 5 s after its end; "quiet" the others. The
  **recovery** of one fault is the largest lateness of the keys due in its window.
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tests.chaos.harness import RunFacts

EARLY_TOLERANCE = 0.001
WINDOW_AFTER = 5.0  # seconds after a fault's end that still count as "during" it
SAMPLES = 10  # examples kept per kind of violation


@dataclass
class Verdict:
    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    lateness: dict[str, dict[str, float]] = field(default_factory=dict)
    recovery: dict[str, dict[str, float]] = field(default_factory=dict)
    faults: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    VIOLATIONS = ("lost", "early", "order_violations", "overlaps", "cancelled_but_ran")

    @property
    def ok(self) -> bool:
        return all(self.counts.get(name, 0) == 0 for name in self.VIOLATIONS)

    def flag(self, what: str, example: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1
        if len(self.examples[what]) < SAMPLES:
            self.examples[what].append(example)


def percentiles(values: Iterable[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {"n": 0}

    def at(share: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(share * len(ordered)))], 3)

    return {"n": len(ordered), "p50": at(0.5), "p99": at(0.99), "max": round(ordered[-1], 3)}


def verify(facts: RunFacts) -> Verdict:
    verdict = Verdict()
    for name in (*Verdict.VIOLATIONS, "duplicates", "late_duplicates", "unknown_runs"):
        verdict.counts[name] = 0
    tasks = {(t.ordering_id, t.seq): t for t in facts.tasks}
    starts: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    runs: dict[str, list[tuple[float, float, int]]] = defaultdict(list)  # o -> (start, end, seq)
    open_runs: dict[int, dict[str, Any]] = {}  # pid -> its running start (one task at a time per worker)
    for event in sorted(facts.executions, key=lambda e: e["t"]):
        pid = event["pid"]
        if event["event"] == "start":
            key = (event["o"], event["seq"])
            if key not in tasks:
                verdict.flag("unknown_runs", str(event))
                continue
            starts[key].append(event)
            if pid in open_runs:  # the previous run of this process never ended: impossible
                verdict.notes.append(f"pid {pid} started {key} while {open_runs[pid]} had no end")
            open_runs[pid] = event
        else:
            begun = open_runs.pop(pid, None)
            if begun is not None:
                runs[begun["o"]].append((begun["t"], event["t"], begun["seq"]))
    for pid, begun in open_runs.items():
        end = facts.killed_workers.get(pid, facts.finished)
        runs[begun["o"]].append((begun["t"], end, begun["seq"]))
        if pid not in facts.killed_workers:
            verdict.notes.append(f"run {begun['o']}/{begun['seq']} in pid {pid} never ended")

    first_start: dict[tuple[str, int], float] = {}
    for key, events in starts.items():
        first_start[key] = min(e["t"] for e in events)
        verdict.counts["duplicates"] += len(events) - 1

    # lost / cancelled / not accepted
    accepted = [t for t in facts.tasks if t.accepted]
    verdict.counts["accepted"] = len(accepted)
    verdict.counts["not_accepted"] = sum(1 for t in facts.tasks if not t.accepted)
    verdict.counts["ran_though_not_accepted"] = sum(
        1 for t in facts.tasks if not t.accepted and (t.ordering_id, t.seq) in starts)
    verdict.counts["cancels_accepted"] = sum(1 for t in accepted if t.cancel_accepted)
    verdict.counts["cancels_not_accepted"] = sum(1 for t in accepted if t.cancel and not t.cancel_accepted)
    verdict.counts["cancelled"] = verdict.counts["cancel_came_too_late"] = 0
    verdict.counts["never_stored"] = 0  # not run, and the store never heard of it either
    for task in accepted:
        key = (task.ordering_id, task.seq)
        ran = key in starts
        if task.cancel and task.status == "cancelled":
            verdict.counts["cancelled"] += 1
            if ran:
                verdict.flag("cancelled_but_ran", f"{key} cancelled, yet started at {first_start[key]:.3f}")
            continue
        if ran:
            if task.cancel_accepted:
                verdict.counts["cancel_came_too_late"] += 1
            continue
        verdict.flag("lost", f"{key} due {task.at_ms / 1000:.3f}, cancel accepted: "
                             f"{task.cancel_accepted}, status {task.status}")
        if task.status is None:
            verdict.counts["never_stored"] += 1

    # early, lateness
    lateness: dict[tuple[str, int], float] = {}
    for key, started in first_start.items():
        task = tasks[key]
        late = started - task.at_ms / 1000
        lateness[key] = late
        if late < -EARLY_TOLERANCE:
            verdict.flag("early", f"{key} started {-late:.3f}s before {task.at_ms / 1000:.3f}")

    # order of first starts, overlap of any runs, late duplicates
    by_ordering_id: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for (ordering_id, seq), started in first_start.items():
        by_ordering_id[ordering_id].append((seq, started))
    for ordering_id, seqs in by_ordering_id.items():
        seqs.sort()
        for (seq_a, start_a), (seq_b, start_b) in itertools.pairwise(seqs):
            if start_b < start_a:
                verdict.flag("order_violations",
                             f"{ordering_id}: seq {seq_b} first started {start_a - start_b:.3f}s "
                             f"before seq {seq_a}")
        later_min = float("inf")  # earliest first start among the keys after this one
        for seq, _ in reversed(seqs):
            verdict.counts["late_duplicates"] += sum(
                1 for event in starts[(ordering_id, seq)][1:] if event["t"] > later_min)
            later_min = min(later_min, first_start[(ordering_id, seq)])
    for ordering_id, spans in runs.items():
        spans.sort()
        latest_end, latest_seq = float("-inf"), -1
        for start, end, seq in spans:
            if start < latest_end:
                verdict.flag("overlaps", f"{ordering_id}: seq {seq} started at {start:.3f} while "
                                         f"seq {latest_seq} ran until {latest_end:.3f}")
            if end > latest_end:
                latest_end, latest_seq = end, seq

    # lateness overall, during faults (per kind) and quiet; recovery per fault kind
    windows = sorted((f.inject, (f.restore or f.inject) + WINDOW_AFTER, f.kind) for f in facts.faults)
    due = sorted((tasks[key].at_ms / 1000, late) for key, late in lateness.items())
    due_times = [d for d, _ in due]
    during: set[int] = set()
    per_kind: dict[str, list[float]] = defaultdict(list)
    recoveries: dict[str, list[float]] = defaultdict(list)
    for begin, end, kind in windows:
        low, high = bisect.bisect_left(due_times, begin), bisect.bisect_right(due_times, end)
        during.update(range(low, high))
        values = [late for _, late in due[low:high]]
        per_kind[kind] += values
        if values:
            recoveries[kind].append(max(values))
    verdict.lateness["overall"] = percentiles(late for _, late in due)
    verdict.lateness["during faults"] = percentiles(due[i][1] for i in sorted(during))
    verdict.lateness["quiet"] = percentiles(late for i, (_, late) in enumerate(due) if i not in during)
    for kind in facts.options.kinds:
        verdict.faults[kind] = sum(1 for f in facts.faults if f.kind == kind)
        if kind in per_kind:
            verdict.lateness[f"during {kind}"] = percentiles(per_kind[kind])
        if recoveries.get(kind):
            verdict.recovery[kind] = percentiles(recoveries[kind])
    pauses = [f for f in facts.faults if f.kind == "dispatcher-pause"]
    verdict.counts["pauses_with_takeover"] = sum(
        1 for f in pauses if f.detail.get("partitions_taken_over", 0) > 0)
    return verdict
