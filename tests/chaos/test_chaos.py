"""The short chaos run, and proof that it catches a dispatcher that breaks each guarantee.

They share one set of Kafka, Cassandra and brokers on the chaos ports (they restart them;
each run has a topic, keyspace and queue of its own), started by the first and stopped
after the last, so they need Java, Maven, redis-server and rabbitmq-server, as
``scripts/services`` does. When another chaos run holds those services the tests are
skipped on a developer machine and fail when ``CI`` is set.
The quick run is done twice: with Redis as the Celery broker, and with RabbitMQ (restarted
instead of Redis), with no Redis configured for the scheduler.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.apps.chaos import MUTANTS
from tests.chaos.__main__ import QUICK
from tests.chaos.harness import (
    BROKERS,
    PERIODIC_ENTRIES,
    ChaosLockBusy,
    Options,
    Run,
    Services,
    chaos_lock,
    fault_kinds,
    save_facts,
    state_root,
)
from tests.chaos.report import render
from tests.chaos.verify import Verdict, verify

# serial: the runs restart services and judge lateness, beside no other test
pytestmark = [pytest.mark.kafka, pytest.mark.cassandra, pytest.mark.redis, pytest.mark.serial]


@pytest.fixture(scope="module")
def chaos_services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = state_root()
    try:
        with chaos_lock(root):
            services = Services(root / "services", tmp_path_factory.mktemp("chaos") / "services.log")
            services.run("wipe", *BROKERS, "kafka", "cassandra")
            try:
                yield root / "services"
            finally:
                services.run("down", *BROKERS, "kafka", "cassandra")
    except ChaosLockBusy as exc:
        if os.environ.get("CI"):
            pytest.fail(str(exc), pytrace=False)
        pytest.skip(str(exc))


# Lines at WARNING or above (and traceback lines) a dispatcher may write in the quick run,
# which restarts Kafka, Cassandra and the broker once each and kills and pauses dispatchers:
# an outage is said once, and its end once. Before that, one dispatcher wrote 374 of them.
NOISY_LINES_PER_DISPATCHER = 60


def noisy_lines(run_dir: Path) -> dict[str, int]:
    """The WARNING-or-above and traceback lines of each dispatcher's log of a run."""
    counted = {}
    for log in sorted(run_dir.glob("dispatcher-*.log")):
        lines = log.read_text(errors="replace").splitlines()
        counted[log.name] = sum(1 for line in lines if re.match(
            r"\[[^\]]*: (WARNING|ERROR|CRITICAL)/|Traceback ", line))
    return counted


def run(options: Options, state: Path, tmp_path: Path) -> Verdict:
    chaos = Run(options, tmp_path, state)
    facts = chaos.execute(fresh=False)
    save_facts(facts, tmp_path / "facts.json")
    verdict = verify(facts)
    print(render(facts, verdict, "tests/chaos/test_chaos.py"))
    return verdict


@pytest.mark.timeout(600)  # about 4 minutes on an idle 2-core machine
@pytest.mark.parametrize("broker", ["redis", pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)])
def test_quick_chaos_run_keeps_every_guarantee(broker: str, chaos_services: Path, tmp_path: Path) -> None:
    options = replace(QUICK, broker=broker, kinds=fault_kinds(broker))
    verdict = run(options, chaos_services, tmp_path)

    assert verdict.faults == dict.fromkeys(fault_kinds(broker), 1), "one fault of every kind"
    # most calls went through (those made while Kafka restarts raise, and are not counted)
    assert verdict.counts["accepted"] > options.tasks / 2
    assert verdict.counts["cancelled"] > 0
    violations = {name: verdict.examples.get(name) for name in Verdict.VIOLATIONS
                  if verdict.counts[name]}
    assert verdict.counts["lost"] == 0, violations
    assert verdict.counts["early"] == 0, violations
    assert verdict.counts["order_violations"] == 0, violations
    assert verdict.counts["overlaps"] == 0, violations
    assert verdict.counts["cancelled_but_ran"] == 0, violations
    # operators paused ordering ids meanwhile; nothing of them was released while paused
    assert verdict.counts["operator_pauses"] > 0
    assert verdict.counts["released_while_paused"] == 0, violations
    # keys were moved meanwhile; none ran at its old time, nor at both
    assert verdict.counts["moved"] > 0
    assert verdict.counts["rescheduled_ran_at_old_time"] == 0, violations
    assert verdict.counts["rescheduled_ran_twice"] == 0, violations
    noisy = noisy_lines(tmp_path)
    print(f"WARNING-or-above lines per dispatcher log: {noisy}")
    assert noisy and max(noisy.values()) <= NOISY_LINES_PER_DISPATCHER, noisy


# Dispatcher kills while tasks are being ingested, by a dispatcher that commits Kafka offsets
# before it writes to Cassandra: each kill drops the batch it had committed but not stored.
# The four kills take about 30 s (a restarted dispatcher leases partitions about 6 s after
# the kill), so the tasks are scheduled over those 30 s only. A short drain: what was lost
# never runs, however long the run waits for it.
# The same kills show a dispatcher that skips the periodic occurrences missed while it took a
# partition over: each kill hands three partitions, and the entries in them, to another. Its
# occurrences are written at their time, not ahead: written 30 s ahead (the default), those
# of a partition without an owner for 6 s are in the store already, and none is missed.
MUTANT = Options(tasks=300, ordering_ids=30, faults_per_kind=4, kinds=("dispatcher-kill",),
                 gap=(1.0, 2.0), drain_seconds=5.0,
                 mutant="commit-before-persist,skip-missed-occurrences",
                 produce_seconds=30.0, periodic=PERIODIC_ENTRIES, periodic_ahead=0.0)


@pytest.mark.timeout(400)
def test_the_chaos_run_catches_a_dispatcher_that_commits_before_it_persists(
        chaos_services: Path, tmp_path: Path) -> None:
    verdict = run(MUTANT, chaos_services, tmp_path)

    assert verdict.faults["dispatcher-kill"] == 4
    assert verdict.counts["never_stored"] > 0  # lost for good, not merely late
    assert verdict.counts["periodic_missed"] > 0
    assert not verdict.ok


# A dispatcher broken on purpose, no faults: each mutant must make the verdict of the
# guarantee it breaks fail (tests.apps.chaos.MUTANTS names which), or that verdict could
# never fail. Half the tasks run 50-500 ms, a third are cancelled, and three keys are moved
# every second, so that every broken rule has tasks to show on.
BROKEN = Options(tasks=200, ordering_ids=20, kinds=(), produce_seconds=10.0, drain_seconds=6.0,
                 delay=(1.0, 5.0), slow_share=0.5, cancel_share=0.3, periodic=PERIODIC_ENTRIES,
                 reschedule_gap=1.0, reschedule_ids=3)
# Mutants share a run where none can break the others' rules: a task released early is
# neither a cancel dropped nor a periodic key made up, nor an overlap policy ignored. Those
# that release an ordering id's tasks wrongly run apart, since either could break the
# other's rule too.
BROKEN_TOGETHER = ("ignore-cancels,periodic-made-up-keys,release-early,overlap-ignored,allow-all-serial,"
                   "ignore-reschedules",
                   "release-out-of-order,overlap-skips-all,reschedule-keeps-old",
                   "release-two-at-once,ignore-pauses")
# The run of a dispatcher that ignores pauses pauses a quarter of its ordering ids at a time,
# soon after it starts: each has a task due about every second while it is paused.
BROKEN_PAUSES = {"pause_gap": 2.0, "pause_ids": 5}
# An overlap policy is judged on occurrences due from 10 s after the start to 10 s before
# the end of scheduling: 15 s holds one of the slow entries' long runs and the occurrences
# after it, whatever the phase.
OVERLAP_PRODUCE_SECONDS = 35.0


def test_every_mutant_is_shown_to_fail_its_verdict() -> None:
    shown = [name for group in (MUTANT.mutant, *BROKEN_TOGETHER) for name in group.split(",")]
    assert sorted(shown) == sorted(MUTANTS)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mutants", BROKEN_TOGETHER)
def test_the_chaos_run_catches_a_dispatcher_broken_on_purpose(
        mutants: str, chaos_services: Path, tmp_path: Path) -> None:
    options = replace(BROKEN, mutant=mutants)
    if "overlap" in mutants:
        options = replace(options, produce_seconds=OVERLAP_PRODUCE_SECONDS)
    if "ignore-pauses" in mutants:
        options = replace(options, **BROKEN_PAUSES)  # type: ignore[arg-type]
    verdict = run(options, chaos_services, tmp_path)

    failed = {name: verdict.counts[MUTANTS[name]] for name in mutants.split(",")}
    assert all(failed.values()), (failed, verdict.counts)
    assert not verdict.ok
