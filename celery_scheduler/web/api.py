"""The HTTP API, ``/api/v1``: schedule a registered task; a task's status; cancel, retry or
move it. What the operators look at is in :mod:`celery_scheduler.web.views`, the periodic
entries in :mod:`celery_scheduler.web.periodic`, pauses, rate limits and bulk cancels in
modules of their own; the tokens and errors here are shared by all of them.

For producers that are not Python, and for tools. Every request carries a bearer token from
``scheduler_api_tokens``: a ``read`` token may look, a ``write`` token may also schedule and
cancel. Every error is a documented status with a JSON body ``{"error": ..., "message": ...}``.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field

from celery_scheduler.api import registered
from celery_scheduler.client import SchedulerClient
from celery_scheduler.envelope import CELERY_OPTIONS
from celery_scheduler.errors import ScheduleError, ScheduleTimeError
from celery_scheduler.keys import TaskKey, check_key_part, to_epoch_ms
from celery_scheduler.operations import (
    describe_key,
    request_cancel,
    request_retry,
)
from celery_scheduler.partitioner import partition_for
from celery_scheduler.web.paths import KeyPart, segments
from celery_scheduler.web.tokens import scope_of

__all__ = ["ERRORS", "OrderingId", "actor", "client", "reader", "router", "writer"]

_bearer = HTTPBearer(auto_error=False, description="a token of scheduler_api_tokens")


class Problem(BaseModel):
    """What every error answers."""

    error: str = Field(description="the error's type")
    message: str = Field(description="what was wrong, with the offending value, and what to do")


ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem, "description": "no token, or one that is not in scheduler_api_tokens"},
    403: {"model": Problem, "description": "a read token where a write token is needed"},
    404: {"model": Problem, "description": "no such task, key or path"},
    422: {"model": Problem, "description": "the request is not a valid call"},
    503: {"model": Problem, "description": "Kafka or Cassandra could not be reached"},
}


def actor(request: Request) -> str:
    """Who an API request acts for, as the operators' log names them."""
    return f"HTTP API from {request.client.host if request.client else 'unknown'}"


def client(request: Request) -> SchedulerClient:
    scheduler: SchedulerClient = request.app.state.client
    return scheduler


def _scope(request: Request, credentials: HTTPAuthorizationCredentials | None) -> str:
    scope = scope_of(client(request).settings.api_tokens,
                     credentials.credentials if credentials is not None else None)
    if scope is None:
        raise HTTPException(401, "a bearer token of scheduler_api_tokens is needed",
                            headers={"WWW-Authenticate": "Bearer"})
    return str(scope)


def reader(request: Request,
           credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
    _scope(request, credentials)


def writer(request: Request,
           credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
    if _scope(request, credentials) != "write":
        raise HTTPException(403, "this token may only read: scheduling and cancelling need a "
                                 "write token")


router = APIRouter(prefix="/api/v1", responses=ERRORS)

_ENCODED = ("; percent-encoded whole, '/' included, and sent with one more '~' in front when it "
            "is '.' or '..' after any number of '~'")
OrderingId = Annotated[KeyPart, Path(min_length=1, max_length=513,
                                     description="the ordering id" + _ENCODED)]
At = Annotated[str, Path(description="the scheduled time, ISO 8601 (UTC if no offset)")]
Unique = Annotated[KeyPart, Path(min_length=1, max_length=513,
                                 description="the uniqueness key" + _ENCODED)]


def task_key(ordering_id: str, at: str, unique: str) -> TaskKey:
    """The task key of a path, or a 422 saying which part is wrong."""
    try:
        when = dt.datetime.fromisoformat(at.replace("Z", "+00:00"))
    except ValueError:
        raise ScheduleTimeError(f"{at!r} is not an ISO 8601 time") from None
    return TaskKey(check_key_part(ordering_id, "ordering id"), to_epoch_ms(when, dt.timezone.utc),
                   check_key_part(unique, "uniqueness key"))


class ScheduleRequest(BaseModel):
    """A schedule call, as ``task.schedule(args, kwargs, at=... | countdown=..., ...)``."""

    task: str = Field(description="the Celery name of a task decorated with @scheduled_task",
                      min_length=1, max_length=512)
    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    at: dt.datetime | None = Field(default=None, description="when to run, ISO 8601")
    countdown: float | None = Field(default=None, description="or: in how many seconds")
    ordering_id: str | None = None
    uniqueness_key: str | None = None
    options: dict[str, Any] = Field(default_factory=dict,
                                    description="Celery options: queue, priority, time_limit, ...")


class Scheduled(BaseModel):
    ordering_id: str
    at: str
    uniqueness_key: str
    task_id: str = Field(description="the Celery task id the task runs with")
    partition: int
    path: str = Field(description="the task's path under /api/v1, its key parts encoded: "
                                  "GET it for the status, DELETE it to cancel")


@router.post("/tasks", status_code=201, response_model=Scheduled,
             dependencies=[Depends(writer)])
def schedule(call: ScheduleRequest, request: Request) -> Scheduled:
    """Schedule a task the server's app registered; returns once Kafka acknowledged it."""
    task = registered().get(call.task)
    if task is None:
        raise HTTPException(404, f"task {call.task!r} is not a scheduled task of this app; "
                                 f"known: {sorted(registered())}")
    unknown = sorted(set(call.options) - set(CELERY_OPTIONS))
    if unknown:  # not keyword arguments of schedule() either
        raise ScheduleError(f"unsupported Celery option(s) {unknown}; scheduled tasks accept "
                            + ", ".join(sorted(CELERY_OPTIONS)))
    handle = task.schedule(call.args, call.kwargs, at=call.at, countdown=call.countdown,
                           ordering_id=call.ordering_id, uniqueness_key=call.uniqueness_key,
                           **call.options)
    key = handle.key
    at = key.scheduled_at.isoformat()
    return Scheduled(ordering_id=key.ordering_id, at=at, uniqueness_key=key.uniqueness_key,
                     task_id=handle.task_id,
                     path="/tasks/" + segments(key.ordering_id, at, key.uniqueness_key),
                     partition=partition_for(key.ordering_id, client(request).task_log.partitions()))


class TaskView(BaseModel):
    key: dict[str, str]
    task_id: str
    state: str
    task: str | None
    partition: int | None
    attempts: int
    last_error: str | None = None
    updated: str | None = None
    outcome: str | None = None
    outcome_attempt: int | None = None
    released: str | None = None
    started: str | None = None
    ended: str | None = None
    args: str | None = None
    kwargs: str | None = None
    options: dict[str, Any] | None = None
    retry: dict[str, Any] | None = None
    enqueued: str | None = None
    not_before: str | None = None
    lease_until: str | None = None
    blocked: bool | None = None
    moved_to: str | None = Field(default=None, description="a rescheduled key: the key it moved to")
    operator_actions: list[str] | None = Field(
        default=None, description="the operators' log lines on it, its ordering id or its task")


@router.get("/tasks/{ordering_id}/{at}/{unique}", response_model=TaskView,
            dependencies=[Depends(reader)])
def status(ordering_id: OrderingId, at: At, unique: Unique, request: Request) -> TaskView:
    """Everything the store knows of a task key."""
    key = task_key(ordering_id, at, unique)
    scheduler = client(request)
    described = describe_key(scheduler.store, key, scheduler.clock())
    if described is None:
        raise HTTPException(404, f"{key} is unknown (never stored, or its status expired)")
    return TaskView(**described)


class CancelRequested(BaseModel):
    key: str
    cancel: str = "requested"


@router.delete("/tasks/{ordering_id}/{at}/{unique}", status_code=202,
               response_model=CancelRequested, dependencies=[Depends(writer)])
def cancel(ordering_id: OrderingId, at: At, unique: Unique, request: Request) -> CancelRequested:
    """Ask for a pending task not to run (it still runs if it was already released)."""
    key = task_key(ordering_id, at, unique)
    request_cancel(client(request), key, by=actor(request))
    return CancelRequested(key=str(key))


class RetryRequested(BaseModel):
    key: str
    retry: str = "requested"


@router.post("/tasks/{ordering_id}/{at}/{unique}/retry", status_code=202,
             response_model=RetryRequested, dependencies=[Depends(writer)],
             responses={409: {"model": Problem, "description": "the task is not failed, or "
                                                                "cannot run again"}})
def retry(ordering_id: OrderingId, at: At, unique: Unique, request: Request) -> RetryRequested:
    """Run a failed task once more; a blocked ordering id moves on once it succeeds."""
    key = task_key(ordering_id, at, unique)
    request_retry(client(request), key, by=actor(request))
    return RetryRequested(key=str(key))


class RescheduleRequest(BaseModel):
    """The new time of a pending task: exactly one of ``at`` and ``countdown``."""

    at: dt.datetime | None = Field(default=None, description="the new time, ISO 8601 (UTC if no offset)")
    countdown: float | None = Field(default=None, description="or: in how many seconds from now")


class RescheduleRequested(BaseModel):
    key: str
    reschedule: str = "requested"
    to: dict[str, str] = Field(description="the new key: ordering_id, at, uniqueness_key")
    path: str = Field(description="the new key's path under /api/v1: GET it for its status")


@router.post("/tasks/{ordering_id}/{at}/{unique}/reschedule", status_code=202,
             response_model=RescheduleRequested, dependencies=[Depends(writer)],
             responses={409: {"model": Problem, "description": "the task cannot move: released "
                                                                "already, finished, cancelled or "
                                                                "moved"}})
def reschedule(ordering_id: OrderingId, at: At, unique: Unique, move: RescheduleRequest,
               request: Request) -> RescheduleRequested:
    """Move a pending task to another time, with its arguments and task id; its old time
    never fires. A task released already is refused (409): it runs at its time."""
    from celery_scheduler.reschedules import new_time_ms, request_reschedule

    key = task_key(ordering_id, at, unique)
    scheduler = client(request)
    moved = request_reschedule(
        scheduler, key, new_time_ms(move.at, move.countdown, scheduler.clock()), by=actor(request))
    new_at = moved.key.scheduled_at.isoformat()
    return RescheduleRequested(
        key=str(key), to={"ordering_id": key.ordering_id, "at": new_at,
                          "uniqueness_key": key.uniqueness_key},
        path="/tasks/" + segments(key.ordering_id, new_at, key.uniqueness_key))
