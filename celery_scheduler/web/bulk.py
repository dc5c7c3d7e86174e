"""``POST /api/v1/cancel-many``: cancel every pending key of an ordering id, a task name or a
span of due times, or count them (``dry_run``); see :mod:`celery_scheduler.bulk_cancel`."""

from __future__ import annotations

import datetime as dt

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field

from celery_scheduler.bulk_cancel import Selection, cancel_many, settle
from celery_scheduler.web.api import ERRORS, actor, client, writer

__all__ = ["router"]

router = APIRouter(prefix="/api/v1", responses=ERRORS)
LONGEST_WAIT = 60.0


class CancelManyRequest(BaseModel):
    """Which keys (every criterion given must hold; at least one), and whether to cancel them."""

    ordering_id: str | None = Field(default=None, min_length=1, max_length=512)
    task: str | None = Field(default=None, min_length=1, max_length=512)
    due_from: dt.datetime | None = Field(default=None, description="due at or after (ISO 8601, "
                                                                   "UTC if no offset)")
    due_before: dt.datetime | None = Field(default=None, description="due before")
    dry_run: bool = Field(default=False, description="count and list them, cancel nothing")
    wait: float = Field(default=0.0, ge=0.0, le=LONGEST_WAIT,
                        description="seconds to wait for the dispatchers to apply the cancels")


class CancelManyOut(BaseModel):
    selection: str
    dry_run: bool
    matched: int
    requested: int = Field(description="pending keys whose cancel went to Kafka (dry run: would)")
    released: int = Field(description="already released to the workers: left to run")
    already_cancelled: int
    cancelled: int | None = Field(description="with wait: ended cancelled")
    released_first: int | None = Field(description="with wait: released before the cancel was read")
    unsettled: int | None = Field(description="with wait: neither yet")
    examples: dict[str, list[str]] = Field(description="the first keys of each kind")


def _aware(when: dt.datetime | None) -> dt.datetime | None:
    return when if when is None or when.tzinfo is not None else when.replace(tzinfo=dt.timezone.utc)


@router.post("/cancel-many", response_model=CancelManyOut, dependencies=[Depends(writer)])
def cancel_many_route(call: CancelManyRequest, request: Request) -> CancelManyOut:
    """Cancel every pending key the selection matches; keys already released are left to run
    and counted apart. For selections of many thousands, the CLI's ``cancel-many`` shows
    progress as it goes."""
    scheduler = client(request)
    selection = Selection(call.ordering_id, call.task, _aware(call.due_from), _aware(call.due_before))
    report = cancel_many(scheduler, selection, dry_run=call.dry_run, keep_keys=call.wait > 0,
                         by=actor(request))
    if call.wait > 0:
        settle(scheduler, report, call.wait)
    return CancelManyOut.model_validate(report.as_json())
