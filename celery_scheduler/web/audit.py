"""The operators' log on the web: ``GET /api/v1/audit`` and the console's page (``/audit``),
newest first (see :mod:`celery_scheduler.audit`)."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, Response
from pydantic import BaseModel

from celery_scheduler import audit
from celery_scheduler.errors import SchedulerError
from celery_scheduler.web.api import ERRORS, reader
from celery_scheduler.web.pages import Token, _guard, _kept, _message, _page

__all__ = ["pages", "router"]

router = APIRouter(prefix="/api/v1", responses=ERRORS)
pages = APIRouter(include_in_schema=False)
TITLE = "Operators' log"


class ActionOut(BaseModel):
    at: dt.datetime
    actor: str
    action: str
    target: str
    detail: str


@router.get("/audit", response_model=list[ActionOut], dependencies=[Depends(reader)])
def audit_route(request: Request, limit: Annotated[int, Query(ge=1, le=10_000)] = 100
                ) -> list[ActionOut]:
    """The operators' last actions, newest first: pauses, resumes, cancels, retries, bulk
    cancels, changes of periodic entries."""
    return [ActionOut.model_validate(audit.as_json(action))
            for action in audit.recent(request.app.state.celery_app, limit)]


@pages.get("/audit", response_class=HTMLResponse)
def audit_page(request: Request, token: Token = None) -> Response:
    refused = _guard(request, token)
    if refused is not None:
        return refused
    try:
        actions = audit.recent(request.app.state.celery_app, 200)
    except SchedulerError as exc:
        return _message(request, TITLE, str(exc), 503)
    rows = [(line["at"], line["actor"], line["action"], line["target"], line["detail"])
            for line in map(audit.as_json, actions)]
    return _kept(_page(request, "audit.html", TITLE, rows=rows), token)
