"""Check a chaos run against the guarantees, from the independent execution log alone.

The rules (each run of a task writes ``start`` and ``end`` lines; a *key* is an
(ordering id, seq) pair, one schedule call):

- **lost**: the schedule call returned successfully ("accepted"), no cancel of it was
  accepted, and the key never started. A key whose cancel was accepted must either have been
  cancelled (store status ``cancelled``) or have run (the cancel came after its release);
  anything else is lost too. A call that raised is made again with the same key (up to the
  run's retries); a key none of whose calls was accepted never counts as lost.
- **not accepted but ran**: every call of a key raised, and yet it ran.
- **retried and scheduled twice**: a key whose first call raised ran to its end twice or
  more, and two of those runs cannot be one schedule's releases: the later one is neither
  the next attempt, nor another copy of the same release, nor a release sent again once
  nothing had been heard of the one before for its start lease and the 3 s after it (a call
  made again must not schedule a second run; at least once allows the rest).
- **early**: a key's first start is more than 1 ms before its scheduled time (the key
  stores milliseconds).
- **order violation**: within one ordering id, a key first started before an earlier key
  (by seq: scheduled times rise with seq) whose accepted call was made before the later
  key's first call. A call that raised may still have been written to the log, so a call
  made again after a later key's first call may have enqueued it after that key: the two
  are not compared.
- **overlap**: two runs of one ordering id (any runs, duplicates included) overlap in time.
  A run with no ``end`` ended when its worker was SIGKILLed; a run with no end in a live
  worker counts as still running at the end of the run.
- **duplicate**: a second or later start of a key; reported with how many started after a
  later key of the same ordering id had already started ("late duplicates"), which is
  allowed (at least once) but worth watching.
- **cancelled but ran**: a key whose cancel was accepted has a start in the log, and either
  its store status is ``cancelled``, or the cancel was acknowledged before the release could
  have been marked (a dispatcher marks a release no earlier than its due time less
  ``scheduler_release_ahead_seconds``). A cancel acknowledged later "came too late" only
  when a run's release says it was marked before the cancel call was made; the rest are
  counted as not judged.
- **periodic missed**: an occurrence of a periodic entry (the run's ``periodic`` option: a
  name and an interval, firing at the multiples of the interval since the epoch) due from
  10 s after the run's start to 10 s before the end of scheduling never started. Each run of an entry
  logs its task id, which the occurrence's key fixes; a run whose task id is no occurrence of
  its entry is a **periodic stray** (an occurrence fired under a made-up key could run
  twice). Two runs of an occurrence are duplicates (at least once); runs of one entry are
  checked for overlap like those of any ordering id, and its first starts for being early.
- **overlap policy**: an entry whose ``overlap`` is ``skip`` or ``buffer_one`` may skip
  occurrences (they are not missed). Each is judged against the run of the occurrence before
  it that ran: an occurrence that ran while that run clearly went on (``skip``) or clearly
  had not started (``buffer_one``) **broke the policy**; one skipped when that run had
  clearly ended (``skip``) or started (``buffer_one``) was **skipped wrongly**. Clearly: by
  more than 2 s, with no fault's window between the two occurrences; the rest are skips
  not judged. An ``allow_all`` entry's occurrences must each run (else missed), at their
  time: one that started more than 2 s late, outside any fault's window, while a run of an
  earlier occurrence clearly went on, **waited** for it, unless every thread of the worker
  that runs the slow entries was busy then (runs released again after an outage add to
  those that may go on at once): that one waited for a thread, and is counted apart.
- **released while paused**: a key of an ordering id an operator paused started from a
  release marked (the release's header says when) after every pause call had returned plus
  5 s (dispatchers read the pauses every 2 s, and a step may take a few seconds between its
  read and its marks) and before the first resume call. A key due while its ordering id was
  paused, or up to 5 s after, that first started once the pause began was **held by a
  pause**: its lateness is the operator's doing, and is reported apart from the others.
- **hot bursts**: the keys of a hot burst (hundreds of one ordering id, due 50 ms apart) run
  one at a time, each after the outcome of the one before, so the last of them waits for all
  the others, fault or not: their lateness is reported apart too, and is not in the figures
  below (overall, during faults, quiet, recovery).
- **rescheduled**: a key an operator moved (``handle.reschedule``) runs at one of its two
  times, never both: a run at the old time while the old key's store status says
  ``rescheduled``, or of a move acknowledged before the old key's release could be marked
  (its due time less ``scheduler_release_ahead_seconds``), **ran at the old time**; runs at
  both times, or at the new time of a move refused before it was sent, **ran twice**. Which
  time a run was for, its arguments say (the move changes them). Its runs at the new time
  are judged early, late and in order by the new time; a move that came after the release
  (the old key ran, the new never appeared) is counted apart.
- **lateness**: first start minus scheduled time (or minus the time of its accepted call,
  when that was made later: a call made again), over all keys that ran; "during faults"
  are keys due between a fault's injection and 5 s after its end; "quiet" the others. The
  **recovery** of one fault is the largest lateness of the keys due in its window.
"""

from __future__ import annotations

import bisect
import datetime as dt
import itertools
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from celery_scheduler.keys import TaskKey
from celery_scheduler.partitioner import partition_for
from tests.chaos.harness import (
    PARTITIONS,
    SLOW_WORKER_THREADS,
    OperatorPause,
    PeriodicEntry,
    RunFacts,
    Task,
)

EARLY_TOLERANCE = 0.001
PERIODIC_PREFIX = "periodic:"
# the end of an allow_all occurrence's ordering id: "@", the occurrence, and "#n" when n > 0
ALLOW_ALL_SUFFIX = re.compile(r"@\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00(#\d+)?$")
# Seconds from the run's start (a dispatcher holds partitions by then) before an entry's
# occurrences must run: it fires from its first occurrence after its partition was taken.
PERIODIC_STARTUP = 10.0
# ... and up to this long before the end of scheduling (a run may stop soon after it)
PERIODIC_SETTLE = 10.0
WINDOW_AFTER = 5.0  # seconds after a fault's end that still count as "during" it
# An overlap policy is judged when the run before an occurrence started, or ended, more than
# this long before or after it: a run's outcome is marked, and an occurrence fired, a little
# after the moment the log shows.
OVERLAP_SLACK = 2.0
SAMPLES = 10  # examples kept per kind of violation
# A release marked this long after an operator's pause call returned must not be of a key
# it pauses: dispatchers read the pauses every 2 s (celery_scheduler.dispatcher.pausing), and
# a step's marks may come a few seconds after its read while the services are slow.
PAUSE_READ_SECONDS = 5.0
HOT_BURSTS = "hot bursts (one at a time, in order)"


@dataclass
class Verdict:
    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    lateness: dict[str, dict[str, float]] = field(default_factory=dict)
    recovery: dict[str, dict[str, float]] = field(default_factory=dict)
    # the same over the faults that overlapped no other (until their last key started)
    recovery_alone: dict[str, dict[str, float]] = field(default_factory=dict)
    # the slowest recoveries: (seconds, kind, the kinds of the faults its window overlapped)
    worst_recoveries: list[tuple[float, str, list[str]]] = field(default_factory=list)
    faults: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    VIOLATIONS = ("lost", "early", "order_violations", "overlaps", "cancelled_but_ran",
                  "not_accepted_but_ran", "retried_ran_twice", "periodic_missed", "periodic_strays",
                  "periodic_overlap_broken", "periodic_skipped_wrongly", "periodic_allow_all_waited",
                  "released_while_paused", "rescheduled_ran_at_old_time", "rescheduled_ran_twice")

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


def first_call_ms(task: Task) -> int:
    """When *task*'s first schedule call was made (see Task.first_call_ms)."""
    if task.first_call_ms or task.calls <= 1:
        return task.first_call_ms or task.call_ms
    return min(task.call_ms, task.at_ms - int(task.delay * 1000))


def _judge_cancel(verdict: Verdict, task: Task, runs: list[dict[str, Any]], started: float,
                  ahead_ms: int) -> None:
    """A key whose cancel was accepted ran: allowed only if its release was marked first."""
    key = (task.ordering_id, task.seq)
    earliest_mark_ms = task.at_ms - ahead_ms  # no release of it is marked before
    if task.status == "cancelled":
        verdict.flag("cancelled_but_ran", f"{key} cancelled, yet started at {started:.3f}")
    elif task.cancel_ms < earliest_mark_ms:
        verdict.flag("cancelled_but_ran",
                     f"{key}: cancel acknowledged {(earliest_mark_ms - task.cancel_ms) / 1000:.3f}s "
                     f"before its release could be marked, yet started at {started:.3f}")
    elif any(0 < run.get("m", 0) <= task.cancel_sent_ms for run in runs):
        verdict.counts["cancel_came_too_late"] += 1
    else:
        verdict.counts["cancel_not_judged"] += 1


# A release of which nothing was heard is sent again (the same attempt) no sooner than this
# long after its start lease ended (celery_scheduler.heartbeat.not_started_by_ms).
NOT_STARTED_JUDGED_MS = 3_000


def _scheduled_again(runs: list[dict[str, Any]]) -> str | None:
    """Why two runs of a key that both ended cannot be one schedule's release sent again; None
    if each is: the next attempt, a release sent again once nothing was heard of the one
    before for its start lease and the judgement after it, or another copy of one release.

    A call made again that scheduled the key a second time would release it afresh: at the
    first attempt again, or as the same attempt before the release before it could be judged.
    """
    ordered = sorted(runs, key=lambda e: e["t"])
    for before, after in itertools.pairwise(ordered):
        if "a" not in before or "a" not in after:
            continue  # runs without a release header say nothing
        if after["a"] > before["a"] or after.get("l") == before.get("l"):
            continue
        if after["a"] < before["a"]:
            return f"attempt {after['a']} ran after attempt {before['a']}"
        if after.get("m", 0) < before.get("l", 0) + NOT_STARTED_JUDGED_MS:
            return (f"attempt {after['a']} released again {(after['m'] - before['l']) / 1000:.3f}s "
                    "after the start lease of the one before ended, before it could be judged")
    return None


def verify(facts: RunFacts) -> Verdict:
    verdict = Verdict()
    for name in (*Verdict.VIOLATIONS, "duplicates", "late_duplicates", "unknown_runs",
                 "completed_twice", "retried_completed_twice"):
        verdict.counts[name] = 0
    tasks = {(t.ordering_id, t.seq): t for t in facts.tasks}
    starts: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    runs: dict[str, list[tuple[float, float, int]]] = defaultdict(list)  # o -> (start, end, seq)
    # (pid, ordering id) -> its running start: a worker runs one task at a time, but a slow
    # periodic worker two (threads), of two entries; an end names its ordering id
    open_runs: dict[tuple[int, str], dict[str, Any]] = {}
    completed: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)  # starts of runs that ended
    periodic_starts: list[dict[str, Any]] = []
    periodic_ends: dict[str, float] = {}  # task id -> when its last run that ended ended
    # a run cut short ended when its worker was killed, or stopped itself (see lease_stops)
    stops = lease_stops(facts.unexpected_exits)
    verdict.counts["lease_stops"] = len(stops)
    ended = {**facts.killed_workers, **stops}
    for event in sorted(facts.executions, key=lambda e: e["t"]):
        pid = event["pid"]
        if event["event"] == "start":
            key = (event["o"], event["seq"])
            if event["o"].startswith(PERIODIC_PREFIX):
                periodic_starts.append(event)
                open_runs[(pid, event["o"])] = event
                continue
            if key not in tasks:
                verdict.flag("unknown_runs", str(event))
                continue
            starts[key].append(event)
            busy = [(run, begun) for run, begun in open_runs.items() if run[0] == pid]
            end = ended.get(pid)
            for run, begun in busy:
                if end is not None and begun["t"] <= end <= event["t"]:
                    # the worker ended in that run, and a later process got its pid
                    del open_runs[run]
                    runs[begun["o"]].append((begun["t"], end, begun["seq"]))
                else:  # the previous run of this process never ended: impossible
                    verdict.notes.append(f"pid {pid} started {key} while {begun} had no end")
            open_runs[(pid, event["o"])] = event
        else:
            begun = open_runs.pop((pid, event["o"]), None)
            if begun is not None:
                runs[begun["o"]].append((begun["t"], event["t"], begun["seq"]))
                if not begun["o"].startswith(PERIODIC_PREFIX):
                    completed[(begun["o"], begun["seq"])].append(begun)
                elif "task_id" in begun:
                    periodic_ends[begun["task_id"]] = event["t"]
    for (pid, _), begun in open_runs.items():
        end = ended.get(pid, facts.finished)
        runs[begun["o"]].append((begun["t"], end, begun["seq"]))
        if pid not in ended:
            verdict.notes.append(f"run {begun['o']}/{begun['seq']} in pid {pid} never ended")
        elif begun["o"].startswith(PERIODIC_PREFIX) and "task_id" in begun:
            periodic_ends[begun["task_id"]] = max(periodic_ends.get(begun["task_id"], end), end)

    first_start: dict[tuple[str, int], float] = {}
    for key, events in starts.items():
        first_start[key] = min(e["t"] for e in events)
        verdict.counts["duplicates"] += len(events) - 1

    # lost / cancelled / not accepted / retried
    accepted = [t for t in facts.tasks if t.accepted]
    verdict.counts["accepted"] = len(accepted)
    verdict.counts["not_accepted"] = sum(1 for t in facts.tasks if not t.accepted)
    retried = [t for t in facts.tasks if t.calls > 1]
    verdict.counts["retried"] = len(retried)
    verdict.counts["retried_accepted"] = sum(1 for t in retried if t.accepted)
    verdict.counts["retried_ran"] = sum(1 for t in retried if (t.ordering_id, t.seq) in starts)
    for task in facts.tasks:
        key = (task.ordering_id, task.seq)
        if not task.accepted and key in starts:
            verdict.flag("not_accepted_but_ran", f"{key}: {task.calls} call(s), the last raised "
                                                 f"{task.error}; started at {first_start[key]:.3f}")
        if len(completed[key]) > 1:
            if task.calls > 1:
                verdict.counts["retried_completed_twice"] += 1
                unexplained = _scheduled_again(completed[key])
                if unexplained:
                    verdict.flag("retried_ran_twice", f"{key}: {task.calls} calls, ran to its end "
                                                      f"{len(completed[key])} times; {unexplained}")
            else:
                verdict.counts["completed_twice"] += 1
    verdict.counts["cancels_accepted"] = sum(1 for t in accepted if t.cancel_accepted)
    verdict.counts["cancels_not_accepted"] = sum(1 for t in accepted if t.cancel and not t.cancel_accepted)
    for name in ("cancelled", "cancel_came_too_late", "cancel_not_judged", "never_stored"):
        verdict.counts[name] = 0  # never_stored: not run, and the store never heard of it either
    for task in accepted:
        key = (task.ordering_id, task.seq)
        ran = key in starts
        if task.cancel_accepted and ran:
            _judge_cancel(verdict, task, starts[key], first_start[key], facts.release_ahead_ms)
            continue
        if task.cancel and task.status == "cancelled":
            verdict.counts["cancelled"] += 1
            continue
        if ran:
            continue
        verdict.flag("lost", f"{key} due {task.at_ms / 1000:.3f}, cancel accepted: "
                             f"{task.cancel_accepted}, status {task.status}")
        if task.status is None:
            verdict.counts["never_stored"] += 1

    # early, lateness: by the time each run was for (a moved key's new one, or its old)
    due_ms = _verify_moves(verdict, facts.tasks, starts, facts.release_ahead_ms)
    lateness: dict[tuple[str, int], float] = {}
    for key, events in starts.items():
        task = tasks[key]
        for event in events:
            own = _run_for(task, event)
            if event["t"] - own / 1000 < -EARLY_TOLERANCE:
                verdict.flag("early", f"{key} started {own / 1000 - event['t']:.3f}s before "
                                      f"{own / 1000:.3f}")
        asked_ms = task.move_sent_ms if key in due_ms else task.call_ms
        lateness[key] = first_start[key] - max(due_ms.get(key, task.at_ms), asked_ms) / 1000
    held = _verify_pauses(verdict, facts.pauses, starts, first_start, tasks)
    if held:
        verdict.lateness["held by operators' pauses"] = percentiles(lateness[key] for key in held)
        lateness = {key: late for key, late in lateness.items() if key not in held}
    # a hot burst's keys run one at a time, each after the outcome of the one before: the last
    # waits for the hundreds before it, fault or not, so they are a row of their own
    burst = {key for key in lateness if tasks[key].burst}
    if burst:
        verdict.lateness[HOT_BURSTS] = percentiles(lateness[key] for key in burst)
        lateness = {key: late for key, late in lateness.items() if key not in burst}

    # order of first starts, overlap of any runs, late duplicates
    by_ordering_id: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for (ordering_id, seq), started in first_start.items():
        by_ordering_id[ordering_id].append((seq, started))
    for ordering_id, seqs in by_ordering_id.items():
        seqs.sort()
        called = [tasks[(ordering_id, seq)].call_ms for seq, _ in seqs]
        first_called = [first_call_ms(tasks[(ordering_id, seq)]) for seq, _ in seqs]
        for index, (seq_b, start_b) in enumerate(seqs):
            # the earlier keys enqueued before this one, the latest-starting of them
            before = [(start_a, seq_a) for (seq_a, start_a), call_a in zip(seqs[:index], called[:index],
                                                                          strict=True)
                      if call_a <= first_called[index]]
            if before and max(before)[0] > start_b:
                start_a, seq_a = max(before)
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

    windows = sorted((f.inject, (f.restore or f.inject) + WINDOW_AFTER, f.kind) for f in facts.faults)
    _verify_periodic(verdict, facts, periodic_starts, periodic_ends,
                     [(begin, end) for begin, end, _ in windows], runs)

    # lateness overall, during faults (per kind) and quiet; recovery per fault kind
    due = sorted((due_ms.get(key, tasks[key].at_ms) / 1000, late) for key, late in lateness.items())
    due_times = [d for d, _ in due]
    during: set[int] = set()
    per_kind: dict[str, list[float]] = defaultdict(list)
    recoveries: dict[str, list[float]] = defaultdict(list)
    alone: dict[str, list[float]] = defaultdict(list)
    worst: list[tuple[float, str, list[str]]] = []
    # A fault lasts, for what overlaps it, from its injection until its window ends or the
    # last of the window's keys started, whichever is later: a fault injected while another's
    # keys still wait slows their recovery too, even once the first's window is over.
    spans = []
    for begin, end, _ in windows:
        low, high = bisect.bisect_left(due_times, begin), bisect.bisect_right(due_times, end)
        spans.append((begin, max([end] + [at + late for at, late in due[low:high]])))
    for index, (begin, end, kind) in enumerate(windows):
        low, high = bisect.bisect_left(due_times, begin), bisect.bisect_right(due_times, end)
        during.update(range(low, high))
        values = [late for _, late in due[low:high]]
        per_kind[kind] += values
        if values:
            recoveries[kind].append(max(values))
            overlapped = [windows[number][2] for number, (b, e) in enumerate(spans)
                          if number != index and b < spans[index][1] and e > begin]
            if not overlapped:
                alone[kind].append(max(values))
            worst.append((max(values), kind, overlapped))
    verdict.worst_recoveries = sorted(worst, reverse=True)[:5]
    verdict.lateness["overall"] = percentiles(late for _, late in due)
    verdict.lateness["during faults"] = percentiles(due[i][1] for i in sorted(during))
    verdict.lateness["quiet"] = percentiles(late for i, (_, late) in enumerate(due) if i not in during)
    if any(t.far for t in facts.tasks):
        verdict.lateness["scheduled far ahead"] = percentiles(
            late for key, late in lateness.items() if tasks[key].far)
    for kind in facts.options.kinds:
        verdict.faults[kind] = sum(1 for f in facts.faults if f.kind == kind)
        if kind in per_kind:
            verdict.lateness[f"during {kind}"] = percentiles(per_kind[kind])
        if recoveries.get(kind):
            verdict.recovery[kind] = percentiles(recoveries[kind])
            verdict.recovery_alone[kind] = percentiles(alone.get(kind, []))
    pauses = [f for f in facts.faults if f.kind == "dispatcher-pause"]
    verdict.counts["pauses_with_takeover"] = sum(
        1 for f in pauses if f.detail.get("partitions_taken_over", 0) > 0)
    return verdict


def _run_for(task: Task, event: dict[str, Any]) -> int:
    """The scheduled time (ms) a run of *task* was for: a moved key's new one, if the run's
    arguments say so (a reschedule changes them), else its own."""
    if task.move_to_ms and abs(event.get("scheduled_for", 0.0) * 1000 - task.move_to_ms) < 1.5:
        return task.move_to_ms
    return task.at_ms


def _verify_moves(verdict: Verdict, all_tasks: list[Task],
                  starts: dict[tuple[str, int], list[dict[str, Any]]],
                  ahead_ms: int) -> dict[tuple[str, int], int]:
    """Flag moved keys that ran at their old time, or at both; return, per key whose first
    run was at its new time, that time."""
    for name in ("reschedules_asked", "reschedules_accepted", "reschedules_refused", "moved",
                 "move_came_too_late", "move_not_run"):
        verdict.counts[name] = 0
    due_ms = {}
    for task in all_tasks:
        if not task.move_to_ms:
            continue
        key = (task.ordering_id, task.seq)
        verdict.counts["reschedules_asked"] += 1
        verdict.counts["reschedules_accepted"] += bool(task.move_accepted)
        verdict.counts["reschedules_refused"] += task.move_refused
        events = sorted(starts.get(key, ()), key=lambda e: e["t"])
        new = [e for e in events if _run_for(task, e) == task.move_to_ms]
        old = [e for e in events if _run_for(task, e) != task.move_to_ms]
        if new and (old or task.move_refused):
            verdict.flag("rescheduled_ran_twice",
                         f"{key}: ran at its old time {task.at_ms / 1000:.3f} ({len(old)} run(s)) "
                         f"and at its new time {task.move_to_ms / 1000:.3f} ({len(new)} run(s))"
                         if old else f"{key}: its move was refused, yet it ran at the new time")
        elif old and (task.status == "rescheduled"
                      or (task.move_accepted and task.move_ms < task.at_ms - ahead_ms)):
            verdict.flag("rescheduled_ran_at_old_time",
                         f"{key}: moved to {task.move_to_ms / 1000:.3f} (acknowledged "
                         f"{(task.at_ms - ahead_ms - task.move_ms) / 1000:.3f}s before its release "
                         f"could be marked; its old key says {task.status}), yet started at "
                         f"{old[0]['t']:.3f} for {task.at_ms / 1000:.3f}")
        elif new:
            verdict.counts["moved"] += 1
        elif old:
            verdict.counts["move_came_too_late"] += 1
        else:
            verdict.counts["move_not_run"] += 1
        if events and _run_for(task, events[0]) == task.move_to_ms:
            due_ms[key] = task.move_to_ms
    return due_ms


def _verify_pauses(verdict: Verdict, pauses: list[OperatorPause],
                   starts: dict[tuple[str, int], list[dict[str, Any]]],
                   first_start: dict[tuple[str, int], float],
                   tasks: dict[tuple[str, int], Task]) -> set[tuple[str, int]]:
    """Flag the releases marked while a pause of their ordering id was in force; return the
    keys a pause held (see the rules above)."""
    verdict.counts["operator_pauses"] = len(pauses)
    by_id: dict[str, list[OperatorPause]] = defaultdict(list)
    for pause in pauses:
        for ordering_id in pause.ordering_ids:
            by_id[ordering_id].append(pause)
    held: set[tuple[str, int]] = set()
    for key, events in starts.items():
        for pause in by_id.get(key[0], ()):
            for event in events:
                marked = event.get("m", 0) / 1000
                if pause.paused + PAUSE_READ_SECONDS <= marked < pause.resumed:
                    verdict.flag("released_while_paused",
                                 f"{key}: released at {marked:.3f}, while paused from "
                                 f"{pause.paused:.3f} to {pause.resumed:.3f}")
            if first_start[key] >= pause.paused and tasks[key].at_ms / 1000 < pause.resumed + WINDOW_AFTER:
                held.add(key)
    verdict.counts["held_by_pauses"] = len(held)
    return held


def occurrence_ids(name: str, seconds: float, since: float, until: float,
                   overlap: str = "buffer_all") -> dict[str, int]:
    """The task ids of entry *name*'s occurrences in [since, until] (epoch seconds), by the
    occurrence (ms): an interval entry fires at the multiples of its interval since the epoch,
    under the key (``periodic:<name>``, the occurrence, the occurrence in ISO 8601 UTC); an
    ``allow_all`` entry's ordering id is the occurrence's own (:func:`allow_all_ordering_id`)."""
    every = int(seconds * 1000)
    first = -(-int(since * 1000) // every) * every
    found = {}
    for at in range(first, int(until * 1000) + 1, every):
        unique = dt.datetime.fromtimestamp(at / 1000, dt.timezone.utc).isoformat(timespec="milliseconds")
        ordering_id = (allow_all_ordering_id(name, unique) if overlap == "allow_all"
                       else PERIODIC_PREFIX + name)
        found[TaskKey(ordering_id, at, unique).task_id] = at
    return found


def allow_all_ordering_id(name: str, occurrence: str) -> str:
    """An allow_all occurrence's ordering id: ``periodic:<name>@<occurrence>``, then ``#n``
    for the least n that puts it in the entry's partition of the chaos topic."""
    home = partition_for(PERIODIC_PREFIX + name, PARTITIONS)
    base = f"{PERIODIC_PREFIX}{name}@{occurrence}"
    return next(candidate for n in itertools.count()
                if partition_for(candidate := f"{base}#{n}" if n else base, PARTITIONS) == home)


def entry_of_run(ordering_id: str) -> str:
    """The entry a periodic run's ordering id names (an allow_all occurrence's included)."""
    return ALLOW_ALL_SUFFIX.sub("", ordering_id.removeprefix(PERIODIC_PREFIX))


# A worker whose running task has had no beat reach Kafka for its run lease ends its own
# process to stop the task (celery_scheduler.heartbeat): by design, not a failure. The harness
# keeps the tail of the log of a worker that exited by itself; its last line says so, and when.
_KILLED_WORKER = re.compile(r"pid (\d+) \(([^)]*worker)\) exited with -9:")
_LEASE_STOP = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}): CRITICAL/MainProcess\] [^\n]*"
                         r"so it is stopped here \(its process is killed\)\s*$")


def lease_stops(exits: Iterable[str]) -> dict[int, float]:
    """Of *exits* (the harness's unexpected exits), the workers that stopped their task
    because its run lease could not be kept: pid -> when (epoch seconds, from the log line,
    which Celery writes in local time)."""
    found: dict[int, float] = {}
    for text in exits:
        head, stop = _KILLED_WORKER.match(text), _LEASE_STOP.search(text)
        if head and stop:
            at = dt.datetime.strptime(stop.group(1), "%Y-%m-%d %H:%M:%S").timestamp()
            found[int(head.group(1))] = at + int(stop.group(2)) / 1000
    return found


def unexpected_exits(facts: RunFacts) -> list[str]:
    """The exits of *facts* that were neither a fault nor a worker's lease stop."""
    stopped = lease_stops(facts.unexpected_exits)
    return [text for text in facts.unexpected_exits
            if not ((head := _KILLED_WORKER.match(text)) and int(head.group(1)) in stopped)]


def _verify_periodic(verdict: Verdict, facts: RunFacts, starts: list[dict[str, Any]],
                     ends: dict[str, float], windows: list[tuple[float, float]],
                     runs: dict[str, list[tuple[float, float, int]]] | None = None) -> None:
    for name in ("periodic_expected", "periodic_ran", "periodic_duplicates", "periodic_skipped",
                 "periodic_skips_not_judged", "periodic_allow_all_worker_full"):
        verdict.counts[name] = 0
    entries = {entry[0]: PeriodicEntry(*entry) for entry in facts.options.periodic}
    # every run of the slow entries, which share one worker's threads
    slow = {name for name, entry in entries.items() if entry.slow_run}
    slow_spans = [(begin, end) for ordering_id, spans in (runs or {}).items()
                  if ordering_id.startswith(PERIODIC_PREFIX) and entry_of_run(ordering_id) in slow
                  for begin, end, _ in spans]

    def slow_worker_full(at: float) -> bool:
        return sum(1 for begin, end in slow_spans if begin <= at < end) >= SLOW_WORKER_THREADS

    by_entry: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in starts:
        by_entry[entry_of_run(event["o"])].append(event)
    lateness: list[float] = []
    for name in sorted(set(entries) | set(by_entry)):
        events = by_entry.get(name, [])
        if name not in entries:
            for event in events:
                verdict.flag("periodic_strays", f"a run of {name}, no entry of the run: {event}")
            continue
        entry = entries[name]
        known = occurrence_ids(name, entry.seconds, facts.started - 600, facts.finished + 600,
                               entry.overlap)
        first_start: dict[str, float] = {}
        for event in events:
            at = known.get(event.get("task_id", ""))
            if at is None:
                verdict.flag("periodic_strays", f"{name}: task id {event.get('task_id')} is no "
                                                f"occurrence's, started at {event['t']:.3f}")
                continue
            if event["task_id"] in first_start:
                verdict.counts["periodic_duplicates"] += 1
            first_start[event["task_id"]] = min(first_start.get(event["task_id"], event["t"]), event["t"])
        for task_id, started in first_start.items():
            at = known[task_id] / 1000
            if started - at < -EARLY_TOLERANCE:
                verdict.flag("early", f"periodic:{name} occurrence {at:.3f} started "
                                      f"{at - started:.3f}s before it")
            if entry.overlap in ("buffer_all", "allow_all"):  # the others wait or skip by design
                lateness.append(started - at)
        expected = occurrence_ids(name, entry.seconds, facts.started + PERIODIC_STARTUP,
                                  facts.produced_until - PERIODIC_SETTLE, entry.overlap)
        verdict.counts["periodic_expected"] += len(expected)
        verdict.counts["periodic_ran"] += sum(1 for task_id in expected if task_id in first_start)
        if entry.overlap in ("skip", "buffer_one"):
            _judge_overlap(verdict, entry, known, expected, first_start, ends, windows)
            continue
        if entry.overlap == "allow_all":
            _judge_allow_all(verdict, entry, events, ends, windows, slow_worker_full)
        for task_id, at in sorted(expected.items(), key=lambda item: item[1]):
            if task_id not in first_start:
                verdict.flag("periodic_missed", f"{name}: the occurrence at {at / 1000:.3f} never started")
    if entries:
        verdict.lateness["periodic occurrences"] = percentiles(lateness)


def _judge_allow_all(verdict: Verdict, entry: PeriodicEntry, events: list[dict[str, Any]],
                     ends: dict[str, float], windows: list[tuple[float, float]],
                     worker_full: Any = lambda at: False) -> None:
    """An ``allow_all`` entry's occurrence starts at its time, whatever runs: one that started
    more than OVERLAP_SLACK late, due outside any fault's window, while a run of an earlier
    occurrence clearly went on at its time, and not before that run ended, **waited** for it
    (one late for another cause, a recovery that outlasts its fault's window, starts while the
    run still goes on). One due while every thread of the slow entries' worker was busy (runs
    released again after an outage add to those that may go on at once) waited for a thread,
    not for the run: counted apart. Each run logs the time its key says (under whatever key it
    ran)."""
    first: dict[str, tuple[float, float]] = {}  # task id -> (first start, its time)
    for event in events:
        if "at" in event and (event["task_id"] not in first or event["t"] < first[event["task_id"]][0]):
            first[event["task_id"]] = (event["t"], event["at"])
    runs = [(began, ends.get(task_id, float("inf")), at) for task_id, (began, at) in first.items()]
    for began, _, at in runs:
        if began - at <= OVERLAP_SLACK or any(low <= began and at <= high for low, high in windows):
            continue
        going = [(b, e) for b, e, other in runs
                 if other < at and b < at - OVERLAP_SLACK and e > at + OVERLAP_SLACK and began >= e]
        if going and worker_full(at + OVERLAP_SLACK):
            verdict.counts["periodic_allow_all_worker_full"] += 1
        elif going:
            b, e = going[0]
            verdict.flag("periodic_allow_all_waited", f"{entry.name} (allow_all): the occurrence "
                                                      f"at {at:.3f} started at {began:.3f}, "
                                                      f"while a run went on {b:.3f}-{e:.3f}")


def _judge_overlap(verdict: Verdict, entry: PeriodicEntry, known: dict[str, int],
                   expected: dict[str, int], first_start: dict[str, float], ends: dict[str, float],
                   windows: list[tuple[float, float]]) -> None:
    """Each occurrence of an entry with an overlap policy ran or was skipped as the policy
    says, judged against the run of the occurrence before it that ran (the one its dispatcher
    looked at): with ``skip``, an occurrence is skipped while that run goes on; with
    ``buffer_one``, while that occurrence still waits to start. Only clear cases are judged:
    the two occurrences due outside any fault (whose outcomes may be marked late), and the
    run before started or ended more than OVERLAP_SLACK away from the occurrence."""
    ran = sorted((at / 1000, task_id) for task_id, at in known.items() if task_id in first_start)
    for task_id, at_ms in sorted(expected.items(), key=lambda item: item[1]):
        at = at_ms / 1000
        index = bisect.bisect_left(ran, (at, ""))
        if index == 0:
            if task_id not in first_start:
                verdict.counts["periodic_skips_not_judged"] += 1
            continue
        before_at, before_id = ran[index - 1]
        began, ended = first_start[before_id], ends.get(before_id, float("inf"))
        if any(low <= at and before_at <= high for low, high in windows):
            if task_id not in first_start:
                verdict.counts["periodic_skips_not_judged"] += 1
            continue
        if entry.overlap == "skip":
            busy, done = began < at - OVERLAP_SLACK and ended > at + OVERLAP_SLACK, ended < at - OVERLAP_SLACK
            state = f"the run of {before_at:.3f} ran {began:.3f}-{ended:.3f}"
        else:
            busy, done = began > at + OVERLAP_SLACK, began < at - OVERLAP_SLACK
            state = f"the occurrence of {before_at:.3f} started at {began:.3f}"
        if task_id in first_start and busy:
            verdict.flag("periodic_overlap_broken", f"{entry.name} ({entry.overlap}): the occurrence "
                                                    f"at {at:.3f} ran, though {state}")
        elif task_id not in first_start and done:
            verdict.flag("periodic_skipped_wrongly", f"{entry.name} ({entry.overlap}): the "
                                                     f"occurrence at {at:.3f} was skipped, though {state}")
        elif task_id not in first_start:
            verdict.counts["periodic_skipped"] += 1
