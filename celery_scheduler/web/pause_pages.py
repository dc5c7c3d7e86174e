"""The console's pauses page: what is paused, since when, by whom and why; with a write
token, a form that pauses a task name, an ordering id or everything, and a resume button
per pause (see :mod:`celery_scheduler.pauses`)."""

from __future__ import annotations

from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from celery_scheduler import pauses
from celery_scheduler.errors import PauseError, SchedulerError
from celery_scheduler.keys import from_epoch_ms
from celery_scheduler.store.records import PauseScope
from celery_scheduler.web.pages import Token, _guard, _kept, _may_write, _message, _page

__all__ = ["router"]

router = APIRouter(include_in_schema=False)
TITLE = "Pauses"


@router.get("/pauses", response_class=HTMLResponse)
def pauses_page(request: Request, token: Token = None) -> Response:
    refused = _guard(request, token)
    if refused is not None:
        return refused
    try:
        kept = pauses.in_force(request.app.state.celery_app)
    except SchedulerError as exc:
        return _message(request, TITLE, str(exc), 503)
    rows = [{"scope": p.scope.value, "value": p.value, "label": p.label,
             "cells": (p.label, from_epoch_ms(p.paused_ms).isoformat(timespec="seconds"), p.by,
                       p.reason)} for p in kept]
    return _kept(_page(request, "pauses.html", TITLE, rows=rows, writer=_may_write(request, token),
                       scopes=[scope.value for scope in PauseScope]), token)


LONGEST_FORM = 4096


@router.post("/pauses/{action}")
async def change_from_page(action: str, request: Request) -> Response:
    """The pause form and the resume buttons: need the write token in the cookie. The form
    comes URL-encoded, as browsers send it (read here: no form parser is needed)."""
    body = await request.body()
    if len(body) > LONGEST_FORM:
        return _message(request, TITLE, f"the form is over {LONGEST_FORM} bytes", 422)
    form = {name: values[0] for name, values in parse_qs(body.decode("utf-8", "replace")).items()}
    scope, value, reason = form.get("scope", ""), form.get("value", ""), form.get("reason", "")
    if action not in ("pause", "resume"):
        return _message(request, TITLE, f"no such action {action!r}", 404)
    if not _may_write(request):
        return _message(request, TITLE, "Pausing and resuming need a write token of "
                                        "scheduler_api_tokens.", 403)
    if scope not in PauseScope._value2member_map_:
        return _message(request, TITLE, f"no such scope {scope!r}: task, ordering_id or all", 422)
    task = value if scope == PauseScope.TASK.value else None
    ordering_id = value if scope == PauseScope.ORDERING_ID.value else None
    everything = scope == PauseScope.ALL.value
    app = request.app.state.celery_app
    try:
        if action == "pause":  # the store's calls block: off the event loop
            await run_in_threadpool(lambda: pauses.pause(
                app, task=task, ordering_id=ordering_id, everything=everything, reason=reason,
                by="console"))
        else:
            await run_in_threadpool(lambda: pauses.resume(
                app, task=task, ordering_id=ordering_id, everything=everything, by="console"))
    except PauseError as exc:
        return _message(request, TITLE, str(exc), 422)
    except SchedulerError as exc:
        return _message(request, TITLE, str(exc), 503)
    return RedirectResponse("/pauses", status_code=303)
