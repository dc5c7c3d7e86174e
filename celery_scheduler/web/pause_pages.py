"""The console's pauses page: what is paused, since when, by whom and why, and the rate
limits in force; with a write token, a form that pauses a task name, an ordering id or
everything, a resume button per pause, a form that sets a rate limit and a lift button per
limit (see :mod:`celery_scheduler.pauses` and :mod:`celery_scheduler.rate_limits`)."""

from __future__ import annotations

from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from celery_scheduler import pauses, rate_limits
from celery_scheduler.errors import PauseError, RateLimitError, SchedulerError
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
        limited = rate_limits.in_force(request.app.state.celery_app)
    except SchedulerError as exc:
        return _message(request, TITLE, str(exc), 503)
    rows = [{"scope": p.scope.value, "value": p.value, "label": p.label,
             "cells": (p.label, from_epoch_ms(p.paused_ms).isoformat(timespec="seconds"), p.by,
                       p.reason)} for p in kept]
    limits = [{"scope": r.scope.value, "value": r.value,
               "cells": (r.label, f"{r.per_second:g}/s",
                         from_epoch_ms(r.set_ms).isoformat(timespec="seconds"), r.by)}
              for r in limited]
    return _kept(_page(request, "pauses.html", TITLE, rows=rows, limits=limits,
                       writer=_may_write(request, token),
                       scopes=[scope.value for scope in PauseScope]), token)


LONGEST_FORM = 4096


async def _form(request: Request) -> dict[str, str] | Response:
    """The form, URL-encoded as browsers send it (read here: no form parser is needed)."""
    body = await request.body()
    if len(body) > LONGEST_FORM:
        return _message(request, TITLE, f"the form is over {LONGEST_FORM} bytes", 422)
    return {name: values[0] for name, values in parse_qs(body.decode("utf-8", "replace")).items()}


@router.post("/rate-limits/{action}")
async def limit_from_page(action: str, request: Request) -> Response:
    """The rate limit form and the lift buttons: need the write token in the cookie."""
    form = await _form(request)
    if isinstance(form, Response):
        return form
    if action not in ("limit", "lift"):
        return _message(request, TITLE, f"no such action {action!r}", 404)
    if not _may_write(request):
        return _message(request, TITLE, "Rate limits need a write token of scheduler_api_tokens.", 403)
    scope, value = form.get("scope", ""), form.get("value", "")
    if scope not in (PauseScope.TASK.value, PauseScope.ORDERING_ID.value):
        return _message(request, TITLE, f"no such scope {scope!r}: task or ordering_id", 422)
    task = value if scope == PauseScope.TASK.value else None
    ordering_id = value if scope == PauseScope.ORDERING_ID.value else None
    app = request.app.state.celery_app
    try:
        if action == "limit":
            try:
                per_second = float(form.get("per_second", ""))
            except ValueError:
                return _message(request, TITLE, f"{form.get('per_second', '')!r:.40} is not a number "
                                                "of releases a second", 422)
            await run_in_threadpool(lambda: rate_limits.limit(
                app, task=task, ordering_id=ordering_id, per_second=per_second, by="console"))
        else:
            await run_in_threadpool(lambda: rate_limits.lift(
                app, task=task, ordering_id=ordering_id, by="console"))
    except RateLimitError as exc:
        return _message(request, TITLE, str(exc), 422)
    except SchedulerError as exc:
        return _message(request, TITLE, str(exc), 503)
    return RedirectResponse("/pauses", status_code=303)


@router.post("/pauses/{action}")
async def change_from_page(action: str, request: Request) -> Response:
    """The pause form and the resume buttons: need the write token in the cookie."""
    form = await _form(request)
    if isinstance(form, Response):
        return form
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
