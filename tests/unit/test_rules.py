"""The release engine's decisions (dispatcher/rules.py), without an engine, a store or a clock."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from celery_scheduler.dispatcher import rules
from celery_scheduler.envelope import RetryPolicy
from celery_scheduler.keys import TaskKey
from celery_scheduler.store.base import State, TaskStatus

NOW = 1_893_456_000_000
POLICY = RetryPolicy(max_attempts=4, backoff=2.0, backoff_max=5.0)


class Fixed(random.Random):
    """A random source that always draws *value* from uniform()."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def uniform(self, a: float, b: float) -> float:
        return a + (b - a) * self.value


def test_a_failure_is_retried_after_a_doubling_backoff_capped_and_jittered_down_to_half() -> None:
    longest = [rules.after_failure(n, POLICY, "skip", NOW, Fixed(1.0)) for n in (1, 2, 3)]
    assert longest == [rules.RetryAt(NOW + 2000, 2000), rules.RetryAt(NOW + 4000, 4000),
                       rules.RetryAt(NOW + 5000, 5000)]
    shortest = rules.after_failure(3, POLICY, "skip", NOW, Fixed(0.0))
    assert shortest == rules.RetryAt(NOW + 2500, 2500)
    drawn = {rules.after_failure(1, POLICY, "skip", NOW, random.Random(seed)) for seed in range(50)}
    assert len(drawn) > 10, "tasks that failed together come back spread out"


def test_the_last_failure_gives_up_or_blocks_as_the_app_says() -> None:
    assert rules.after_failure(4, POLICY, "skip", NOW, random.Random(1)) is rules.Exhausted.GIVE_UP
    assert rules.after_failure(4, POLICY, "block", NOW, random.Random(1)) is rules.Exhausted.BLOCK
    assert rules.after_failure(9, POLICY, "block", NOW, random.Random(1)) is rules.Exhausted.BLOCK


def test_a_success_waits_to_share_a_write_but_not_past_its_next_tasks_marking() -> None:
    assert rules.success_deadline(NOW, 600, None, 0, None) == NOW + 600
    assert rules.success_deadline(NOW, 600, NOW + 300, 100, None) == NOW + 200
    assert rules.success_deadline(NOW, 600, None, 0, NOW + 50) == NOW + 50  # written with the earlier ones


STATUS = TaskStatus(TaskKey("o", NOW, "u"), State.RELEASED, "proj.remind", 0, attempts=2)


@pytest.mark.parametrize(("status", "expected"), [
    (None, None),
    (STATUS, None),  # no outcome reported
    (replace(STATUS, outcome="succeeded", outcome_attempt=2, outcome_generation=NOW + 8000), (True, None)),
    # a worker of an earlier version, which stores no generation
    (replace(STATUS, outcome="failed", outcome_attempt=2, last_error="boom"), (False, "boom")),
    (replace(STATUS, outcome="succeeded", outcome_attempt=1), None),  # an earlier attempt's
    # an earlier release of the same attempt (sent again: it had not started)
    (replace(STATUS, outcome="succeeded", outcome_attempt=2, outcome_generation=NOW), None),
])
def test_only_the_outcome_of_this_release_counts(status: TaskStatus | None,
                                                 expected: tuple[bool, str | None] | None) -> None:
    assert rules.stored_outcome(status, 2, NOW + 8000) == expected


def test_a_lease_over_without_an_outcome_is_judged_only_once_every_report_was_read() -> None:
    end = NOW + 8000
    assert rules.when_lease_ended(end - 1, end, False, True) is rules.LeaseEnd.RUNNING
    assert rules.when_lease_ended(end, end, False, False) is rules.LeaseEnd.RUNNING  # maybe unread
    assert rules.when_lease_ended(end, end, False, True) is rules.LeaseEnd.NOT_STARTED
    assert rules.when_lease_ended(end, end, True, True) is rules.LeaseEnd.WORKER_LOST


@pytest.mark.parametrize(("state", "ended"), [
    (State.PENDING, False), (State.RELEASED, False), (State.SUCCEEDED, True), (State.FAILED, True),
    (State.CANCELLED, True)])
def test_a_task_finished_or_cancelled_elsewhere_does_not_run_here(state: State, ended: bool) -> None:
    assert rules.ended_elsewhere(replace(STATUS, state=state)) is ended
    assert rules.ended_elsewhere(None) is False
