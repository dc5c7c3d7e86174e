"""``/api/v1/pauses``: the pauses in force; pause and resume a task name, an ordering id or
everything (see :mod:`celery_scheduler.pauses`)."""

from __future__ import annotations

import datetime as dt
from typing import Literal

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field

from celery_scheduler import pauses
from celery_scheduler.store.records import Pause, PauseScope
from celery_scheduler.web.api import ERRORS, actor, reader, writer

__all__ = ["router"]

router = APIRouter(prefix="/api/v1", responses=ERRORS)


class PauseOut(BaseModel):
    scope: Literal["task", "ordering_id", "all"]
    value: str = Field(description="the task name or ordering id ('' for all)")
    paused_at: dt.datetime
    by: str = Field(description="who paused it")
    reason: str


class PauseIn(BaseModel):
    """What to pause or resume: a task name, an ordering id, or everything (scope all)."""

    scope: Literal["task", "ordering_id", "all"]
    value: str | None = Field(default=None, max_length=512,
                              description="the task name or ordering id; none for all")
    reason: str = Field(default="", max_length=1000, description="why (pause only)")


def _out(pause: Pause) -> PauseOut:
    return PauseOut.model_validate(pauses.as_json(pause))


def _named(call: PauseIn) -> tuple[str | None, str | None, bool]:
    """The task, ordering id and everything of pauses.pause(); a value given with scope all
    is passed on as a task, so that the operator hears of the mistake."""
    scope = PauseScope(call.scope)
    if scope is PauseScope.ALL:
        return call.value or None, None, True
    value = call.value or ""
    return (value, None, False) if scope is PauseScope.TASK else (None, value, False)


@router.get("/pauses", response_model=list[PauseOut], dependencies=[Depends(reader)])
def pauses_route(request: Request) -> list[PauseOut]:
    """The pauses in force, oldest first."""
    return [_out(p) for p in pauses.in_force(request.app.state.celery_app)]


@router.post("/pauses", response_model=PauseOut, dependencies=[Depends(writer)])
def pause_route(call: PauseIn, request: Request) -> PauseOut:
    """Hold back the releases of a task name, an ordering id or everything; every dispatcher
    holds them within a few seconds, and nothing held is lost."""
    task, ordering_id, everything = _named(call)
    return _out(pauses.pause(request.app.state.celery_app, task=task, ordering_id=ordering_id,
                             everything=everything, reason=call.reason, by=actor(request)))


@router.post("/pauses/resume", response_model=PauseOut, dependencies=[Depends(writer)])
def resume_route(call: PauseIn, request: Request) -> PauseOut:
    """Lift a pause: what it held is released, in order. 422 if it is not paused."""
    task, ordering_id, everything = _named(call)
    return _out(pauses.resume(request.app.state.celery_app, task=task, ordering_id=ordering_id,
                              everything=everything, by=actor(request)))
