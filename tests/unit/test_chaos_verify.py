"""The chaos checker's rules, on execution logs written by hand: each verdict must fail when
its guarantee is broken, and only then."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Any

import pytest

from tests.chaos.harness import Fault, OperatorPause, Options, PeriodicEntry, RunFacts, Task
from tests.chaos.verify import (
    HOT_BURSTS,
    Verdict,
    _judge_allow_all,
    allow_all_ordering_id,
    lease_stops,
    occurrence_ids,
    verify,
)

T0 = 1_900_000_000.0  # the run's start (epoch seconds)


def task(ordering_id: str, seq: int, at: float, **fields: Any) -> Task:
    return Task(ordering_id, seq, 0.0, 1.0, 0.0, bool(fields.get("cancel_accepted")),
                at_ms=int((T0 + at) * 1000), accepted=fields.pop("accepted", True),
                calls=fields.pop("calls", 1), **fields)


def run(ordering_id: str, seq: int, start: float, end: float | None, pid: int = 1,
        **header: Any) -> list[dict[str, Any]]:
    events = [{"event": "start", "o": ordering_id, "seq": seq, "t": T0 + start, "pid": pid, **header}]
    if end is not None:
        events.append({"event": "end", "o": ordering_id, "seq": seq, "t": T0 + end, "pid": pid})
    return events


def facts(tasks: list[Task], executions: list[dict[str, Any]], faults: list[Fault] | None = None,
          killed: dict[int, float] | None = None) -> RunFacts:
    return RunFacts(Options(kinds=()), tasks, faults or [], executions, killed or {}, [],
                    T0, T0 + 100, T0 + 200, True, "")


def violations(verdict: Verdict) -> dict[str, int]:
    return {name: verdict.counts[name] for name in Verdict.VIOLATIONS if verdict.counts[name]}


def test_a_clean_run_passes() -> None:
    verdict = verify(facts([task("a", 0, 10), task("a", 1, 11)],
                           run("a", 0, 10.002, 10.1) + run("a", 1, 11.001, 11.2)))
    assert verdict.ok and violations(verdict) == {}
    assert verdict.lateness["overall"]["n"] == 2


def test_an_accepted_task_that_never_ran_is_lost() -> None:
    verdict = verify(facts([task("a", 0, 10), task("a", 1, 11)], run("a", 0, 10, 10.1)))
    assert violations(verdict) == {"lost": 1}


def test_a_start_before_its_time_is_early() -> None:
    verdict = verify(facts([task("a", 0, 10)], run("a", 0, 9.9, 10.0)))
    assert violations(verdict) == {"early": 1}


def test_a_later_task_first_started_before_an_earlier_one_is_out_of_order() -> None:
    verdict = verify(facts([task("a", 0, 10), task("a", 1, 11)],
                           run("a", 1, 11.0, 11.1) + run("a", 0, 12.0, 12.1)))
    assert violations(verdict) == {"order_violations": 1}


def test_runs_of_one_ordering_id_that_overlap() -> None:
    verdict = verify(facts([task("a", 0, 10), task("a", 1, 11)],
                           run("a", 0, 10.0, 12.0, pid=1) + run("a", 1, 11.5, 11.6, pid=2)))
    assert violations(verdict) == {"overlaps": 1}


def test_a_run_cut_short_by_a_worker_kill_ends_when_it_was_killed() -> None:
    executions = (run("a", 0, 10.0, None, pid=1) + run("a", 0, 20.0, 20.1, pid=2)
                  + run("a", 1, 20.2, 20.3, pid=2))
    clean = verify(facts([task("a", 0, 10), task("a", 1, 11)], executions, killed={1: T0 + 15}))
    assert violations(clean) == {} and clean.counts["duplicates"] == 1
    overlapping = verify(facts([task("a", 0, 10), task("a", 1, 11)], executions,
                               killed={1: T0 + 25}))  # still running when the next started
    assert violations(overlapping) == {"overlaps": 2}


@pytest.mark.parametrize(("cancel_ms", "status", "marked", "verdict_count"), [
    # acknowledged seconds before the release could be marked: it must not run
    (6_000, "succeeded", 9_600, "cancelled_but_ran"),
    # the store says cancelled, and yet it ran
    (9_900, "cancelled", 9_600, "cancelled_but_ran"),
    # the release's header says it was marked before the cancel was made: too late, allowed
    (9_900, "succeeded", 9_600, "cancel_came_too_late"),
    # acknowledged after the earliest mark, and no release says when it was marked
    (9_700, "succeeded", 0, "cancel_not_judged"),
])
def test_a_cancelled_task_that_ran(cancel_ms: int, status: str, marked: int, verdict_count: str) -> None:
    cancelled = task("a", 0, 10, cancel_accepted=True, cancel_sent_ms=int(T0 * 1000) + cancel_ms - 5,
                     cancel_ms=int(T0 * 1000) + cancel_ms, status=status)
    header = {"m": int(T0 * 1000) + marked} if marked else {}
    verdict = verify(facts([cancelled], run("a", 0, 10.001, 10.1, **header)))
    assert verdict.counts[verdict_count] == 1
    assert verdict.ok == (verdict_count != "cancelled_but_ran")


def test_a_cancelled_task_that_did_not_run_is_cancelled_not_lost() -> None:
    cancelled = task("a", 0, 10, cancel_accepted=True, cancel_ms=int(T0 * 1000) + 6_000,
                     status="cancelled")
    verdict = verify(facts([cancelled], []))
    assert verdict.ok and verdict.counts["cancelled"] == 1


def test_a_call_that_raised_every_time_must_not_run() -> None:
    refused = task("a", 0, 10, accepted=False, calls=6, error="TaskLogUnavailableError()")
    assert violations(verify(facts([refused], []))) == {}  # not accepted: not lost either
    assert violations(verify(facts([refused], run("a", 0, 10, 10.1)))) == {"not_accepted_but_ran": 1}


def release(attempt: int, marked: float, start_lease_end: float) -> dict[str, int]:
    """The release header fields a run logs (times in seconds after T0)."""
    return {"a": attempt, "m": int((T0 + marked) * 1000), "l": int((T0 + start_lease_end) * 1000)}


def test_a_retried_call_that_ran_twice() -> None:
    retried = task("a", 0, 10, calls=2)
    first = run("a", 0, 10, 10.1, **release(1, 10, 18))
    once = verify(facts([retried], first))
    assert violations(once) == {} and once.counts["retried_ran"] == 1
    # released afresh while the first release could not yet be judged: scheduled twice
    twice = verify(facts([retried], first + run("a", 0, 12, 12.1, pid=2, **release(1, 12, 20))))
    assert violations(twice) == {"retried_ran_twice": 1}
    # back at the first attempt after the second: scheduled twice
    restarted = verify(facts([retried], run("a", 0, 10, 10.1, **release(2, 10, 18))
                             + run("a", 0, 30, 30.1, pid=2, **release(1, 30, 38))))
    assert violations(restarted) == {"retried_ran_twice": 1}
    # a key never retried that ran twice is a duplicate (at least once), not a violation
    plain = verify(facts([task("a", 0, 10)], first + run("a", 0, 12, 12.1, pid=2, **release(1, 12, 20))))
    assert violations(plain) == {} and plain.counts["completed_twice"] == 1


@pytest.mark.parametrize("second", [
    release(1, 21, 29),  # nothing heard of the first for its start lease and 3 s: sent again
    release(2, 15, 23),  # the next attempt
    release(1, 10, 18),  # another copy of the same release
])
def test_a_retried_call_that_ran_twice_by_at_least_once_is_not_scheduled_twice(
        second: dict[str, int]) -> None:
    runs = run("a", 0, 10, 10.1, **release(1, 10, 18)) + run("a", 0, 22, 22.1, pid=2, **second)
    verdict = verify(facts([task("a", 0, 10, calls=2)], runs))
    assert violations(verdict) == {} and verdict.counts["retried_completed_twice"] == 1

def test_lateness_during_a_fault_and_its_recovery() -> None:
    fault = Fault("worker-kill", "pid 1", T0 + 20, T0 + 21)
    verdict = verify(facts([task("a", 0, 10), task("b", 0, 20.5)],
                           run("a", 0, 10.01, 10.1) + run("b", 0, 27.5, 27.6), faults=[fault]))
    assert verdict.lateness["quiet"]["max"] == pytest.approx(0.01, abs=0.001)
    assert verdict.lateness["during faults"]["max"] == pytest.approx(7.0, abs=0.001)


def test_a_key_enqueued_again_after_a_later_key_is_not_held_to_its_order() -> None:
    late_call = int((T0 + 11.5) * 1000)  # its first call raised; made again after seq 1's
    tasks = [task("a", 0, 10, calls=2, call_ms=late_call), task("a", 1, 11, call_ms=int((T0 + 1) * 1000))]
    executions = run("a", 1, 11.0, 11.1) + run("a", 0, 12.0, 12.1)
    verdict = verify(facts(tasks, executions))
    assert violations(verdict) == {}
    assert verdict.lateness["overall"]["max"] == pytest.approx(0.5, abs=0.001)  # from its call
    tasks[0].call_ms = int((T0 + 0.5) * 1000)  # enqueued first after all: then it must go first
    assert violations(verify(facts(tasks, executions))) == {"order_violations": 1}


def test_a_key_made_again_after_a_later_keys_first_call_raised_is_not_held_to_its_order() -> None:
    """The later key's first call raised, yet may have been written: before the earlier
    key's call made again (the cluster run's o00087, seq 10 before seq 9)."""
    tasks = [task("a", 0, 10, calls=2, call_ms=int((T0 + 5) * 1000), first_call_ms=int((T0 + 1) * 1000)),
             task("a", 1, 11, calls=2, call_ms=int((T0 + 6) * 1000), first_call_ms=int((T0 + 2) * 1000))]
    executions = run("a", 1, 11.0, 11.1) + run("a", 0, 12.0, 12.1)
    assert violations(verify(facts(tasks, executions))) == {}
    tasks[1].first_call_ms = int((T0 + 5.5) * 1000)  # first made after seq 0's accepted call
    assert violations(verify(facts(tasks, executions))) == {"order_violations": 1}


def test_the_report_says_what_the_run_ran_under() -> None:
    from dataclasses import replace

    from tests.chaos.report import render

    run_facts = facts([task("a", 0, 10), task("f", 0, 40, far=True)],
                      run("a", 0, 10.01, 10.1) + run("f", 0, 40.02, 40.1))
    run_facts.options = replace(run_facts.options, cluster=True, far_tasks=1)
    run_facts.conditions = {"run lease": "20 s", "Cassandra": "3 nodes, LOCAL_QUORUM"}
    verdict = verify(run_facts)
    text = render(run_facts, verdict, "scripts/chaos --quick --cluster")
    assert "| run lease | 20 s |" in text and "3 nodes, LOCAL_QUORUM" in text
    assert "Cassandra cluster (3 nodes)" in text
    assert verdict.lateness["scheduled far ahead"]["n"] == 1


def _of_kinds(run_facts: RunFacts) -> RunFacts:
    """*run_facts* with the kinds of its own faults as the run's, in the order injected."""
    from dataclasses import replace

    run_facts.options = replace(run_facts.options,
                                kinds=tuple(dict.fromkeys(f.kind for f in run_facts.faults)))
    return run_facts


def test_recovery_alone_leaves_out_the_faults_that_overlapped_another() -> None:
    from tests.chaos.report import render

    faults = [Fault("worker-kill", "pid 1", T0 + 20, T0 + 21),  # window 20-26, alone
              Fault("kafka-restart", "kafka", T0 + 50, T0 + 60),  # 50-65, with the pause
              Fault("dispatcher-pause", "pid 2", T0 + 62, T0 + 77)]  # 62-82
    run_facts = _of_kinds(facts([task("a", 0, 20.5), task("b", 0, 55), task("c", 0, 64)],
                                run("a", 0, 23.5, 23.6) + run("b", 0, 85, 85.1)
                                + run("c", 0, 70, 70.1), faults=faults))
    verdict = verify(run_facts)
    assert verdict.recovery["kafka-restart"]["max"] == pytest.approx(30.0, abs=0.001)
    assert verdict.recovery_alone["worker-kill"]["max"] == pytest.approx(3.0, abs=0.001)
    assert verdict.recovery_alone["kafka-restart"] == {"n": 0}  # it overlapped the pause
    assert verdict.worst_recoveries[0] == (pytest.approx(30.0, abs=0.001), "kafka-restart",
                                           ["dispatcher-pause"])
    text = render(run_facts, verdict, "scripts/chaos --quick")
    assert "| kafka-restart | 0 | | | |" in text  # among the faults alone
    assert "- 30.0 s, kafka-restart, with dispatcher-pause" in text
    assert "- 3.0 s, worker-kill, alone" in text


def test_a_fault_injected_while_anothers_keys_still_wait_is_not_alone() -> None:
    """A dispatcher kill's window (20-25) ends before a Cassandra restart begins (30), but its
    key due at 21 started only at 46, after the restart: neither recovered alone."""
    faults = [Fault("dispatcher-kill", "pid 1", T0 + 20, T0 + 20),  # window 20-25
              Fault("cassandra-restart", "cassandra", T0 + 30, T0 + 40),  # 30-45
              Fault("worker-kill", "pid 2", T0 + 60, T0 + 60)]  # 60-65, its key at once
    verdict = verify(_of_kinds(facts(
        [task("a", 0, 21), task("b", 0, 31), task("c", 0, 61)],
        run("a", 0, 46, 46.1) + run("b", 0, 46, 46.1) + run("c", 0, 61.5, 61.6), faults=faults)))
    assert verdict.recovery["dispatcher-kill"]["max"] == pytest.approx(25.0, abs=0.001)
    assert verdict.recovery_alone["dispatcher-kill"] == {"n": 0}
    assert verdict.recovery_alone["cassandra-restart"] == {"n": 0}
    assert verdict.recovery_alone["worker-kill"]["max"] == pytest.approx(0.5, abs=0.001)
    assert verdict.worst_recoveries[0] == (pytest.approx(25.0, abs=0.001), "dispatcher-kill",
                                           ["cassandra-restart"])


# --- periodic entries: an entry "tick" every 2 s; occurrences due from T0 + 10 to T0 + 90
ENTRY = ("tick", 2.0)


def periodic_facts(executions: list[dict[str, Any]], entry: PeriodicEntry | tuple[str, float] = ENTRY,
                   faults: list[Fault] | None = None) -> RunFacts:
    return RunFacts(Options(kinds=(), periodic=(PeriodicEntry(*entry),)), [], faults or [], executions,
                    {}, [], T0, T0 + 100, T0 + 200, True, "")


def tick(at: float, start: float | None = None, end: float | None = None, pid: int = 1,
         task_id: str | None = None, entry: tuple[str, float] = ENTRY) -> list[dict[str, Any]]:
    """A run of the occurrence at T0 + *at* (by default starting 20 ms after it)."""
    name, seconds = entry[:2]
    if task_id is None:
        [task_id] = occurrence_ids(name, seconds, T0 + at, T0 + at)
    start = at + 0.02 if start is None else start
    events = run(f"periodic:{name}", 0, start, start + 0.01 if end is None else end, pid)
    for event in events:
        event["task_id"] = task_id
    return events


def every_occurrence(but: tuple[float, ...] = ()) -> list[dict[str, Any]]:
    return [e for at in range(10, 101, 2) if at not in but for e in tick(float(at))]


def test_a_periodic_entry_that_ran_every_occurrence_passes() -> None:
    verdict = verify(periodic_facts(every_occurrence()))
    assert verdict.ok and violations(verdict) == {}
    assert (verdict.counts["periodic_expected"], verdict.counts["periodic_ran"]) == (41, 41)
    assert verdict.lateness["periodic occurrences"]["n"] == 46  # the later ones too


def test_an_occurrence_that_never_ran_is_missed() -> None:
    verdict = verify(periodic_facts(every_occurrence(but=(70.0,))))
    assert violations(verdict) == {"periodic_missed": 1}


def test_a_run_under_a_key_no_occurrence_has_is_a_stray() -> None:
    verdict = verify(periodic_facts(every_occurrence() + tick(71.0, task_id="made-up")))
    assert violations(verdict) == {"periodic_strays": 1}


def test_an_occurrence_run_twice_is_a_duplicate_not_a_violation() -> None:
    verdict = verify(periodic_facts(every_occurrence() + tick(70.0, start=70.5)))
    assert verdict.ok and verdict.counts["periodic_duplicates"] == 1


def test_two_runs_of_an_entry_at_once_overlap_and_a_run_before_its_time_is_early() -> None:
    overlapping = every_occurrence(but=(72.0,)) + tick(72.0, start=72.01, end=75.0, pid=2) \
        + tick(74.0, start=74.5, end=74.6, pid=3)
    assert violations(verify(periodic_facts(overlapping)))["overlaps"] >= 1
    early = every_occurrence(but=(80.0,)) + tick(80.0, start=79.5)
    assert violations(verify(periodic_facts(early))) == {"early": 1}


# --- overlap policies: an entry every 5 s (occurrences due from T0 + 10 to T0 + 90); the run
# of T0 + 10 takes 12 s, so that the occurrences of 15 and 20 fall during it
SKIP = PeriodicEntry("slow", 5.0, "skip", 12.0)
BUFFER_ONE = PeriodicEntry("slow", 5.0, "buffer_one", 12.0)


def slow_runs(entry: PeriodicEntry, ran: dict[float, float], long_run: float = 10.0,
              till: float = 95.0) -> list[dict[str, Any]]:
    """Runs of *entry*'s occurrences: those of *ran* (occurrence: start), then every
    occurrence from 25 on unless *ran* names it (start None: skipped); the first 12 s long."""
    starts = {10.0: 10.02, **ran}
    at = 25.0
    while at <= till:
        starts.setdefault(at, at + 0.02)
        at += entry.seconds
    events = []
    for at, start in sorted(starts.items()):
        if start is not None:
            end = start + 12.0 if at == long_run else start + 0.2
            events += tick(at, start=start, end=end, entry=entry)
    return events


def test_a_skip_entry_skips_the_occurrences_due_while_its_run_goes_on() -> None:
    verdict = verify(periodic_facts(slow_runs(SKIP, {}), SKIP))
    assert verdict.ok and violations(verdict) == {}
    assert verdict.counts["periodic_skipped"] == 2  # 15 and 20, during the run of 10 (to 22)
    assert verdict.counts["periodic_expected"] - verdict.counts["periodic_ran"] == 2


def test_a_skip_entry_that_runs_an_occurrence_due_during_its_run_breaks_its_policy() -> None:
    verdict = verify(periodic_facts(slow_runs(SKIP, {15.0: 22.03}), SKIP))
    assert violations(verdict) == {"periodic_overlap_broken": 1}


def test_a_skip_entry_that_skips_after_its_run_ended_skipped_wrongly() -> None:
    verdict = verify(periodic_facts(slow_runs(SKIP, {25.0: None}), SKIP))  # the run of 10 ended at 22
    assert violations(verdict) == {"periodic_skipped_wrongly": 1}


def test_a_buffer_one_entry_keeps_one_waiting_and_skips_the_next() -> None:
    # 15 waits for the run of 10 (to 22); 20 finds it waiting and is skipped
    verdict = verify(periodic_facts(slow_runs(BUFFER_ONE, {15.0: 22.03}), BUFFER_ONE))
    assert verdict.ok and verdict.counts["periodic_skipped"] == 1
    broken = verify(periodic_facts(slow_runs(BUFFER_ONE, {15.0: 22.03, 20.0: 22.3}), BUFFER_ONE))
    assert violations(broken) == {"periodic_overlap_broken": 1}
    wrongly = verify(periodic_facts(slow_runs(BUFFER_ONE, {15.0: None, 20.0: 22.03}), BUFFER_ONE))
    assert violations(wrongly) == {"periodic_skipped_wrongly": 1}  # 15: the run of 10 had started


def test_skips_near_a_fault_or_within_the_slack_are_not_judged() -> None:
    fault = Fault("cassandra-restart", "cassandra", T0 + 23.0, T0 + 24.0)
    verdict = verify(periodic_facts(slow_runs(SKIP, {25.0: None}), SKIP, [fault]))
    assert verdict.ok and verdict.counts["periodic_skips_not_judged"] == 1
    # the run of 10 ends at 23.5: 25 falls 1.5 s after it, skipped or not
    for start in (None, 25.02):
        close = verify(periodic_facts(slow_runs(SKIP, {10.0: 11.5, 25.0: start}), SKIP))
        assert close.ok, violations(close)


# --- allow_all: each occurrence under an ordering id of its own, at its time
ALLOW_ALL = PeriodicEntry("slow", 5.0, "allow_all", 14.0)


def allow_all_runs(starts: dict[float, float], long_run: float = 10.0, till: float = 95.0
                   ) -> list[dict[str, Any]]:
    """Runs of ALLOW_ALL's occurrences from 10 to *till*, each 20 ms after its time unless
    *starts* says otherwise (occurrence: start), the one of *long_run* 14 s long; each logs
    its own ordering id and time, as the chaos app's runs do."""
    events = []
    at = 10.0
    while at <= till:
        start = starts.get(at, at + 0.02)
        [(task_id, at_ms)] = occurrence_ids("slow", 5.0, T0 + at, T0 + at, "allow_all").items()
        unique = dt.datetime.fromtimestamp(at_ms / 1000, dt.timezone.utc).isoformat(timespec="milliseconds")
        for event in run(allow_all_ordering_id("slow", unique), 0, start,
                         start + (14.0 if at == long_run else 0.2)):
            events.append({**event, "task_id": task_id, "at": at_ms / 1000})
        at += ALLOW_ALL.seconds
    return events


def test_allow_all_runs_side_by_side_each_on_time() -> None:
    verdict = verify(periodic_facts(allow_all_runs({}), ALLOW_ALL))
    assert verdict.ok and violations(verdict) == {}  # 15 and 20 ran during the run of 10
    assert verdict.counts["periodic_expected"] == verdict.counts["periodic_ran"] == 17


def test_an_allow_all_occurrence_that_waited_for_the_run_before_is_flagged() -> None:
    verdict = verify(periodic_facts(allow_all_runs({15.0: 24.03, 20.0: 24.3}), ALLOW_ALL))
    assert violations(verdict) == {"periodic_allow_all_waited": 2}
    missing = [e for e in allow_all_runs({}) if abs(e["at"] - (T0 + 40)) > 0.001]
    assert violations(verify(periodic_facts(missing, ALLOW_ALL))) == {"periodic_missed": 1}


def test_an_allow_all_occurrence_due_while_every_thread_of_the_worker_ran_waited_for_a_thread() -> None:
    # the run of 10 goes on until 24.02, and 15 starts only then: with a thread free at 15 it
    # waited for that run; with every thread busy (runs released again after an outage) for
    # a thread, which is the worker's, not the scheduler's
    events = allow_all_runs({15.0: 24.03})
    ends = {e["task_id"]: e["t"] for e in events if e["event"] == "end"}
    starts = [e for e in events if e["event"] == "start"]
    for full, flagged in ((False, 1), (True, 0)):
        verdict = Verdict()
        verdict.counts["periodic_allow_all_worker_full"] = 0
        _judge_allow_all(verdict, ALLOW_ALL, starts, ends, [], lambda at, full=full: full)
        assert verdict.counts.get("periodic_allow_all_waited", 0) == flagged
        assert verdict.counts["periodic_allow_all_worker_full"] == 1 - flagged


def test_a_worker_that_stopped_its_task_for_its_run_lease_is_told_from_an_unexpected_exit() -> None:
    line = ("[2026-12-06 04:33:48,077: CRITICAL/MainProcess] periodic:slow-skip@... (attempt 1) has "
            "had no beat reach Kafka for its run lease (20.0s): a dispatcher may release it again, "
            "so it is stopped here (its process is killed)\n")
    stopped = "pid 7 (slow periodic worker) exited with -9:\n[2026-12-06 04:33:45,782: ERROR] x\n" + line
    at = dt.datetime(2026, 12, 6, 4, 33, 48, 77_000).timestamp()  # Celery logs local time
    assert lease_stops([stopped]) == {7: pytest.approx(at)}
    # killed otherwise, or a dispatcher, or that line not the last: unexpected
    assert lease_stops([stopped.replace("-9", "1"), stopped.replace("slow periodic worker", "dispatcher"),
                        stopped + "[2026-12-06 04:33:49,000: INFO] later\n"]) == {}


def paused_facts(marked: float, started: float) -> RunFacts:
    """Ordering id a paused from 20 to 40; its key due at 22 released at *marked*."""
    return replace(facts([task("a", 0, 22), task("b", 0, 25)],
                         run("a", 0, started, started + 0.1, m=int((T0 + marked) * 1000))
                         + run("b", 0, 25.001, 25.1, m=int((T0 + 25) * 1000))),
                   pauses=[OperatorPause(["a"], T0 + 20, T0 + 40)])


def test_a_key_released_while_its_ordering_id_was_paused_is_flagged() -> None:
    verdict = verify(paused_facts(marked=30, started=30.01))
    assert violations(verdict) == {"released_while_paused": 1}
    assert verdict.examples["released_while_paused"][0].startswith("('a', 0): released at")


@pytest.mark.parametrize("marked", [24.0, 40.0])  # within the pauses' read time, or resumed
def test_a_key_released_before_the_pause_was_read_or_once_resumed_passes(marked: float) -> None:
    verdict = verify(paused_facts(marked=marked, started=marked + 0.01))
    assert verdict.ok, violations(verdict)
    assert verdict.counts["operator_pauses"] == 1


def test_a_key_held_by_a_pause_is_kept_out_of_the_lateness_figures() -> None:
    verdict = verify(paused_facts(marked=40.0, started=40.01))
    assert verdict.counts["held_by_pauses"] == 1
    assert verdict.lateness["held by operators' pauses"]["max"] == pytest.approx(18.01, abs=1e-3)
    assert verdict.lateness["overall"]["n"] == 1  # b's only


def test_a_hot_bursts_keys_are_kept_out_of_the_lateness_figures_but_still_judged() -> None:
    # h's three keys run one at a time, the last 2 s late; b is on time
    tasks = [task("h", seq, 20 + seq * 0.05, burst=True) for seq in range(3)] + [task("b", 0, 25)]
    runs = (run("h", 0, 20.01, 21) + run("h", 1, 21.01, 22) + run("h", 2, 22.1, 22.2)
            + run("b", 0, 25.001, 25.1))
    verdict = verify(facts(tasks, runs))
    assert verdict.ok, violations(verdict)
    assert verdict.lateness[HOT_BURSTS]["n"] == 3
    assert verdict.lateness[HOT_BURSTS]["max"] == pytest.approx(2.0, abs=1e-3)
    assert verdict.lateness["overall"]["n"] == 1 and verdict.lateness["quiet"]["max"] < 0.01
    # ... and out of order they still fail
    swapped = verify(facts(tasks, run("h", 0, 20.01, 21) + run("h", 2, 21.01, 22)
                           + run("h", 1, 22.1, 22.2) + run("b", 0, 25.001, 25.1)))
    assert violations(swapped) == {"order_violations": 1}


def moved(seq: int = 0, at: float = 20.0, to: float = 15.0, **fields: Any) -> Task:
    """A key due at *at*, moved to *to* by a reschedule acknowledged at 5 s."""
    return task("a", seq, at, move_to_ms=int((T0 + to) * 1000), move_sent_ms=int((T0 + 4.9) * 1000),
                move_ms=int((T0 + 5) * 1000), move_accepted=fields.pop("move_accepted", True), **fields)


def at_time(seq: int, start: float, scheduled: float) -> list[dict[str, Any]]:
    return run("a", seq, start, start + 0.1, scheduled_for=T0 + scheduled)


def test_a_moved_key_that_ran_at_its_new_time_passes_and_is_judged_by_it() -> None:
    verdict = verify(facts([moved(status="rescheduled")], at_time(0, 15.002, 15)))
    assert verdict.ok, violations(verdict)
    assert (verdict.counts["moved"], verdict.counts["reschedules_asked"]) == (1, 1)
    assert verdict.lateness["overall"]["max"] == pytest.approx(0.002, abs=1e-3)
    early = verify(facts([moved(to=25.0)], at_time(0, 24.0, 25)))
    assert violations(early) == {"early": 1}


def test_a_moved_key_that_ran_at_its_old_time_or_at_both_is_flagged() -> None:
    old = verify(facts([moved(status="succeeded")], at_time(0, 20.001, 20)))
    assert violations(old) == {"rescheduled_ran_at_old_time": 1}
    both = verify(facts([moved(status="rescheduled")], at_time(0, 15.001, 15) + at_time(0, 20.001, 20)))
    assert violations(both) == {"rescheduled_ran_twice": 1}
    refused = verify(facts([moved(move_accepted=False, move_refused=True)], at_time(0, 15.001, 15)))
    assert violations(refused) == {"rescheduled_ran_twice": 1}


def test_a_move_that_came_after_the_release_may_leave_the_key_at_its_old_time() -> None:
    late = replace(moved(at=5.2, to=8.0, status="succeeded"))
    verdict = verify(facts([late], at_time(0, 5.201, 5.2)))
    assert verdict.ok, violations(verdict)
    assert verdict.counts["move_came_too_late"] == 1
    # a move that raised may or may not have been written: either time passes, not both
    unsure = verify(facts([moved(move_accepted=False, status="succeeded")], at_time(0, 20.001, 20)))
    assert unsure.ok, violations(unsure)


def test_a_killed_workers_pid_taken_by_a_later_process_ends_the_killed_run() -> None:
    """pids wrap around in a long run: a process started after a worker's kill may get its
    pid. The killed worker's run ended at the kill, not at the end of the run, and the new
    process's runs are its own, not runs started beside it."""
    executions = run("a", 0, 10.0, None, pid=7) + run("b", 0, 30.0, 30.1, pid=7)
    tasks = [task("a", 0, 10), task("b", 0, 29), task("a", 1, 20)]
    executions += run("a", 1, 20.5, 20.6, pid=8)
    reused = verify(facts(tasks, executions, killed={7: T0 + 15}))
    assert violations(reused) == {} and reused.notes == []
    # not killed: a process that starts a task while its last one goes on is impossible
    impossible = verify(facts(tasks, executions))
    assert any("had no end" in note for note in impossible.notes)
    assert violations(impossible) == {"overlaps": 1}  # a/0 then runs to the end, beside a/1
