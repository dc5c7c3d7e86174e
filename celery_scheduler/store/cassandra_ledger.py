"""What the dispatcher that holds a partition writes of its keys on Cassandra: releases,
retries, completions and the workers' outcomes. Each is a transition the lifecycle decides
(:mod:`celery_scheduler.store.lifecycle`), written blind (the dispatcher knows the key's
state), many of them in one request where they share a Cassandra partition
(``CqlSession.batches``). The calls of :class:`CassandraScheduleStore` (a mixin).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from celery_scheduler.keys import TaskKey
from celery_scheduler.store import lifecycle
from celery_scheduler.store.cql import Statements
from celery_scheduler.store.records import RunTimes, State, StoredTask, TaskStatus
from celery_scheduler.store.transitions import Transition

if TYPE_CHECKING:
    from celery_scheduler.store.cqlsession import CqlSession

__all__ = ["LedgerWrites"]


class LedgerWrites:
    """The release ledger's writes of :class:`CassandraScheduleStore` (a mixin)."""

    if TYPE_CHECKING:  # the store's own
        _cql: CqlSession

        def _written(self, transition: Transition | None) -> Statements: ...

        def status(self, key: TaskKey) -> TaskStatus | None: ...

        def statuses(self, keys: Sequence[TaskKey]) -> list[TaskStatus | None]: ...

    def mark_released(self, task: StoredTask, attempt: int, lease_until_ms: int, now_ms: int) -> None:
        self._cql.batch(f"mark {task.key} released", task.partition,
                        self._written(lifecycle.released(task, attempt, lease_until_ms, now_ms)))

    def mark_released_many(self, releases: Sequence[tuple[StoredTask, int, int]], now_ms: int) -> None:
        self._cql.batches(f"mark {len(releases)} task(s) released", self._released(releases, now_ms))

    def _released(self, releases: Sequence[tuple[StoredTask, int, int]], now_ms: int
                  ) -> list[tuple[int, Statements]]:
        return [(task.partition, self._written(lifecycle.released(task, attempt, lease_until_ms, now_ms)))
                for task, attempt, lease_until_ms in releases]

    def mark_released_and_succeeded(self, releases: Sequence[tuple[StoredTask, int, int]],
                                    succeeded: Sequence[StoredTask], now_ms: int,
                                    runs: Mapping[TaskKey, RunTimes] | None = None) -> None:
        # One batches() call: the writes of both share requests, and are waited for together.
        self._cql.batches(f"mark {len(releases)} task(s) released and {len(succeeded)} succeeded",
                          self._released(releases, now_ms)
                          + self._finished(succeeded, State.SUCCEEDED, now_ms, runs))

    def mark_retry(self, task: StoredTask, attempts: int, not_before_ms: int, error: str | None,
                   now_ms: int) -> None:
        self._cql.batch(f"schedule a retry of {task.key}", task.partition,
                        self._written(lifecycle.retry_later(task, attempts, not_before_ms, error, now_ms)))

    @staticmethod
    def _may_have_error(task: StoredTask) -> bool:
        # Only a failed attempt (or a failed publish) records an error, and each of those
        # leaves a retry time on the row; a first attempt without one has none to keep.
        return task.attempts > 1 or task.not_before_ms > 0

    def finish(self, task: StoredTask, state: State, error: str | None, now_ms: int,
               keep_row: bool = False, run: RunTimes | None = None) -> None:
        # the whole status row is written again (see lifecycle.Expiry): keep its last error
        current = self.status(task.key) if error is None and self._may_have_error(task) else None
        transition = (lifecycle.blocked(task, error, current, now_ms, run) if keep_row
                      else lifecycle.finished(task, state, error, current, now_ms, run))
        self._cql.batch(f"mark {task.key} {state.value}", task.partition, self._written(transition))

    def finish_many(self, tasks: Sequence[StoredTask], state: State, now_ms: int,
                    runs: Mapping[TaskKey, RunTimes] | None = None) -> None:
        self._cql.batches(f"mark {len(tasks)} task(s) {state.value}",
                          self._finished(tasks, state, now_ms, runs))

    def _finished(self, tasks: Sequence[StoredTask], state: State, now_ms: int,
                  runs: Mapping[TaskKey, RunTimes] | None) -> list[tuple[int, Statements]]:
        """The writes that finish *tasks*; reads the statuses of those that may hold an error."""
        reading = [task.key for task in tasks if self._may_have_error(task)]
        current = dict(zip(reading, self.statuses(reading), strict=True)) if reading else {}
        runs = runs or {}
        return [(task.partition, self._written(lifecycle.finished(
                    task, state, None, current.get(task.key), now_ms, runs.get(task.key))))
                for task in tasks]

    def record_outcome(self, partition: int, key: TaskKey, attempt: int, succeeded: bool,
                       error: str | None, now_ms: int, run: RunTimes | None = None,
                       generation: int = 0) -> None:
        [statement] = self._written(lifecycle.reported(key, attempt, succeeded, error, now_ms, run,
                                                       generation))
        self._cql.execute(f"record the outcome of {key}", *statement, partition)

    def record_outcomes(self, outcomes: Sequence[tuple[int, TaskKey, int, bool, str | None, int]],
                        now_ms: int, runs: Mapping[TaskKey, RunTimes] | None = None) -> None:
        runs = runs or {}
        self._cql.batches(f"record {len(outcomes)} outcome(s)",
                          [(partition, self._written(lifecycle.reported(
                              key, attempt, succeeded, error, now_ms, runs.get(key), generation)))
                           for partition, key, attempt, succeeded, error, generation in outcomes])
