"""``/api/v1/rate-limits``: the rate limits in force; cap or lift the releases of a task
name or an ordering id (see :mod:`celery_scheduler.rate_limits`)."""

from __future__ import annotations

import datetime as dt
from typing import Literal

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field

from celery_scheduler import rate_limits
from celery_scheduler.store.records import PauseScope, RateLimit
from celery_scheduler.web.api import ERRORS, actor, reader, writer

__all__ = ["router"]

router = APIRouter(prefix="/api/v1", responses=ERRORS)


class RateLimitOut(BaseModel):
    scope: Literal["task", "ordering_id"]
    value: str = Field(description="the task name or ordering id")
    per_second: float = Field(description="releases a second at most, across every dispatcher")
    set_at: dt.datetime
    by: str = Field(description="who set it")


class RateLimitIn(BaseModel):
    """What to limit (or lift): a task name or an ordering id."""

    scope: Literal["task", "ordering_id"]
    value: str = Field(max_length=512, description="the task name or ordering id")
    per_second: float | None = Field(default=None, description="at most this many releases a "
                                                                "second (not for a lift)")


def _out(limit: RateLimit) -> RateLimitOut:
    return RateLimitOut.model_validate(rate_limits.as_json(limit))


def _named(call: RateLimitIn) -> tuple[str | None, str | None]:
    return (call.value, None) if PauseScope(call.scope) is PauseScope.TASK else (None, call.value)


@router.get("/rate-limits", response_model=list[RateLimitOut], dependencies=[Depends(reader)])
def rate_limits_route(request: Request) -> list[RateLimitOut]:
    """The rate limits in force, oldest first."""
    return [_out(r) for r in rate_limits.in_force(request.app.state.celery_app)]


@router.post("/rate-limits", response_model=RateLimitOut, dependencies=[Depends(writer)])
def rate_limit_route(call: RateLimitIn, request: Request) -> RateLimitOut:
    """Cap the releases of a task name (shared among the dispatchers by the partitions each
    holds) or of an ordering id; every dispatcher applies it within a few seconds. 422 if
    ``per_second`` is missing or not above 0."""
    task, ordering_id = _named(call)
    return _out(rate_limits.limit(request.app.state.celery_app, task=task, ordering_id=ordering_id,
                                  per_second=call.per_second,  # type: ignore[arg-type]
                                  by=actor(request)))


@router.post("/rate-limits/lift", response_model=RateLimitOut, dependencies=[Depends(writer)])
def lift_route(call: RateLimitIn, request: Request) -> RateLimitOut:
    """Lift a rate limit: what waits for its slot goes at once. 422 if there is none."""
    task, ordering_id = _named(call)
    return _out(rate_limits.lift(request.app.state.celery_app, task=task, ordering_id=ordering_id,
                                 by=actor(request)))
