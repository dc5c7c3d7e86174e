"""``/api/v1``'s views for operators: partitions and their leases, an ordering id's tasks,
tasks in a state, what falls due next, dead letters."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, Field

from celery_scheduler.keys import check_key_part
from celery_scheduler.operations import (
    LISTED_STATES,
    due_soon,
    ordering_id_tasks,
    partitions,
    read_dead_letters,
    tasks_in_state,
)
from celery_scheduler.web.api import ERRORS, OrderingId, client, reader

__all__ = ["router"]

router = APIRouter(prefix="/api/v1", responses=ERRORS)


class PartitionOut(BaseModel):
    partition: int
    owner: str | None
    epoch: int
    lease_expires: str | None
    leased: bool
    pending: int
    oldest: str | None
    overdue_seconds: float
    lag: int | None


@router.get("/partitions", response_model=list[PartitionOut], dependencies=[Depends(reader)])
def list_partitions(request: Request, lag: Annotated[bool, Query(
        description="also ask Kafka for the dispatchers' consumer lag")] = False,
                    ) -> list[PartitionOut]:
    """Every partition: lease owner and expiry, backlog, oldest task, and optionally lag."""
    from celery_scheduler.operations import consumer_lag

    scheduler = client(request)
    lags = consumer_lag(scheduler.settings) if lag else None
    return [PartitionOut(**asdict(view))
            for view in partitions(scheduler.task_log.partitions(), scheduler.store, scheduler.clock(), lags)]


class OrderingTaskOut(BaseModel):
    at: str = Field(description="the scheduled time, ISO 8601")
    unique: str = Field(description="the uniqueness key")
    task_id: str
    task: str
    state: str = Field(description="pending, released, succeeded, failed or cancelled; ? if unknown")
    attempts: int
    not_before: str | None = Field(description="a retry waits until then")
    lease_until: str | None = Field(description="released: runs again then if no outcome came")
    blocked: bool = Field(description="out of attempts, holding its ordering id (on_exhausted=block)")
    last_error: str | None


@router.get("/ordering-ids/{ordering_id}/tasks", response_model=list[OrderingTaskOut],
            dependencies=[Depends(reader)])
def list_ordering_id(ordering_id: OrderingId, request: Request,
                     limit: Annotated[int, Query(ge=1, le=10_000)] = 1000) -> list[OrderingTaskOut]:
    """The tasks of an ordering id still in the schedule, in the order they will run."""
    scheduler = client(request)
    found = ordering_id_tasks(scheduler.store, scheduler.task_log.partitions(),
                              check_key_part(ordering_id, "ordering id"), limit)
    return [OrderingTaskOut(**task) for task in found]


class ListedTaskOut(BaseModel):
    ordering_id: str
    at: str = Field(description="the scheduled time, ISO 8601")
    unique: str = Field(description="the uniqueness key")
    task: str
    state: str = Field(description="failed, blocked or released")
    attempts: int
    last_error: str | None
    note: str = Field(description="blocked, when it failed, or until when it is leased")


State = Annotated[str, Query(pattern="^(" + "|".join(LISTED_STATES) + ")$",
                             description="failed (a scan of the status table), blocked or "
                                         "released (a walk of the schedule)")]


@router.get("/tasks", response_model=list[ListedTaskOut], dependencies=[Depends(reader)])
def list_in_state(state: State, request: Request,
                  limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> list[ListedTaskOut]:
    """The tasks that failed, are blocked after their last attempt, or are released."""
    scheduler = client(request)
    return [ListedTaskOut(**task) for task in
            tasks_in_state(scheduler.store, scheduler.task_log.partitions(), state, limit)]


class DueBucket(BaseModel):
    start: str = Field(description="when the bucket starts, ISO 8601")
    tasks: int = Field(description="tasks due in it")


class DueSoonOut(BaseModel):
    bucket_seconds: int = Field(description="how much time each bucket covers")
    overdue: int = Field(description="tasks in buckets that ended before now, not yet finished")
    buckets: list[DueBucket] = Field(description="from the bucket of now on")


@router.get("/due-soon", response_model=DueSoonOut, dependencies=[Depends(reader)])
def list_due_soon(request: Request,
                  buckets: Annotated[int, Query(ge=1, le=1440)] = 30) -> DueSoonOut:
    """How many tasks fall due in each of the next buckets of the schedule, over all partitions."""
    scheduler = client(request)
    coming = due_soon(scheduler.task_log.partitions(), scheduler.store, scheduler.clock(), buckets)
    return DueSoonOut(bucket_seconds=coming.bucket_seconds, overdue=coming.overdue,
                      buckets=[DueBucket(start=start, tasks=count) for start, count in coming.buckets])


class DeadLetterOut(BaseModel):
    offset: int
    reason: str
    source: str
    key: str | None
    value: str | None
    task: str | None


@router.get("/dead-letters", response_model=list[DeadLetterOut], dependencies=[Depends(reader)])
def dead_letters(request: Request,
                 reason: Annotated[str | None, Query(max_length=200)] = None,
                 limit: Annotated[int, Query(ge=1, le=10_000)] = 100) -> list[DeadLetterOut]:
    """Records the dispatchers refused, oldest first, with the reason."""
    found = []
    for letter in read_dead_letters(client(request).settings, reason):
        found.append(DeadLetterOut(**letter.as_json()))
        if len(found) == limit:
            break
    return found
