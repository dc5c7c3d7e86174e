"""``/api/v1/periodic``: the periodic entries the dispatchers fire, and changes to them at run
time (see :mod:`celery_scheduler.periodic_admin`)."""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from pydantic import BaseModel, Field

from celery_scheduler import periodic_admin
from celery_scheduler.errors import PeriodicEntryError
from celery_scheduler.periodic_views import entry_views
from celery_scheduler.web.api import ERRORS, actor, client, reader, writer

__all__ = ["router"]

router = APIRouter(prefix="/api/v1", responses=ERRORS)


class PeriodicEntryOut(BaseModel):
    name: str
    task: str
    schedule: str = Field(description="Celery's schedule, as it prints itself")
    partition: int = Field(description="the partition whose dispatcher fires the entry")
    catch_up: str
    scheduled_task: bool = Field(description="false: dispatchers refuse to start with this entry")
    source: str = Field(description="beat_schedule, run time, or beat_schedule replaced at run time")
    state: str = Field(description="active, paused or deleted")
    last_fired: dt.datetime | None = Field(description="the latest occurrence written")
    last_state: str | None = Field(description="its task's state (null: unknown or expired)")
    last_error: str | None
    next: list[dt.datetime]


@router.get("/periodic", response_model=list[PeriodicEntryOut], dependencies=[Depends(reader)])
def periodic_entries(request: Request,
                     upcoming: Annotated[int, Query(ge=0, le=100)] = 3) -> list[PeriodicEntryOut]:
    """The entries of the app's beat_schedule, fired by the dispatchers (scheduler_periodic)."""
    views = entry_views(request.app.state.celery_app, client(request), upcoming)
    return [PeriodicEntryOut(**asdict(view)) for view in views]


class PeriodicEntryIn(BaseModel):
    task: str
    every: float | None = Field(default=None, gt=0, description="seconds between runs")
    crontab: str | None = Field(default=None, description="MINUTE HOUR DAY_OF_MONTH MONTH DAY_OF_WEEK")
    solar: str | None = Field(default=None, description="EVENT LATITUDE LONGITUDE, e.g. sunrise 48.85 2.35")
    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    options: dict[str, Any] = Field(default_factory=dict)
    catch_up: str = "last"
    jitter: float = 0.0
    overlap: str = "buffer_all"


@router.put("/periodic/{name}", status_code=204, dependencies=[Depends(writer)])
def add_periodic_entry(name: str, entry: PeriodicEntryIn, request: Request) -> None:
    """Add entry *name* at run time, or replace its definition (one of every, crontab and
    solar)."""
    try:
        schedule = periodic_admin.schedule_from_text(name, entry.every, entry.crontab, entry.solar)
    except PeriodicEntryError as exc:
        raise HTTPException(422, str(exc)) from None
    periodic_admin.add(request.app.state.celery_app, name, {
        "task": entry.task, "schedule": schedule, "args": entry.args, "kwargs": entry.kwargs,
        "options": entry.options, "catch_up": entry.catch_up, "jitter": entry.jitter,
        "overlap": entry.overlap}, by=actor(request))


@router.post("/periodic/{name}/{action}", status_code=204, dependencies=[Depends(writer)])
def change_periodic_entry(name: str, action: Annotated[str, Path(pattern="^(pause|resume|reset)$")],
                          request: Request) -> None:
    """Pause, resume or reset (to beat_schedule's) entry *name*."""
    getattr(periodic_admin, action)(request.app.state.celery_app, name, by=actor(request))


@router.delete("/periodic/{name}", status_code=204, dependencies=[Depends(writer)])
def delete_periodic_entry(name: str, request: Request) -> None:
    """Entry *name* never fires again, whatever beat_schedule says (until reset)."""
    periodic_admin.delete(request.app.state.celery_app, name, by=actor(request))
