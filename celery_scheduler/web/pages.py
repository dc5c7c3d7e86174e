"""The console's pages: partitions and what falls due next, an ordering id's timeline, the
failed and blocked tasks, one task key, the dead letters, the periodic entries.

Server-rendered from Jinja2 templates (``web/templates``, every value escaped; no scripts):
a ``read`` token opens them, given once as ``?token=...`` and kept in a cookie (same-site
only). With a ``write`` token the failed and blocked page also has retry buttons, and a
cancel button per blocked task; an ordering id's page, a button that cancels every pending
task of it after a page that counts them.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated, Any

import jinja2
from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from celery_scheduler import periodic_admin
from celery_scheduler.bulk_cancel import Selection, cancel_many
from celery_scheduler.errors import (
    NotReschedulableError,
    NotRetryableError,
    PeriodicEntryError,
    ScheduleError,
    SchedulerError,
)
from celery_scheduler.operations import (
    describe_key,
    due_soon,
    ordering_id_tasks,
    partitions,
    read_dead_letters,
    request_cancel,
    request_retry,
    tasks_in_state,
    waiting_note,
)
from celery_scheduler.periodic_views import entry_views
from celery_scheduler.web.api import client, task_key
from celery_scheduler.web.paths import KeyPart, segment, segments
from celery_scheduler.web.tokens import scope_of

__all__ = ["router"]

COOKIE = "celery_scheduler_token"
router = APIRouter(include_in_schema=False)

# Every value is escaped as it is written, whatever the template's name: an ordering id,
# a uniqueness key, arguments and error text all come from whoever may schedule a task.
# A name a template does not define fails the page instead of showing nothing.
_templates = Jinja2Templates(env=jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).with_name("templates")),
    autoescape=True, undefined=jinja2.StrictUndefined))


def _page(request: Request, template: str, title: str, status: int = 200,
          **context: Any) -> Response:
    return _templates.TemplateResponse(request, template, {"title": title, **context},
                                       status_code=status)


def _message(request: Request, title: str, message: str, status: int) -> Response:
    """A page saying *message* (text: escaped like every value)."""
    return _page(request, "base.html", title, status, message=message)


def _scope(request: Request, token: str | None) -> str | None:
    return scope_of(client(request).settings.api_tokens, token or request.cookies.get(COOKIE))


def _may_write(request: Request, token: str | None = None) -> bool:
    return _scope(request, token) == "write"


def _guard(request: Request, token: str | None) -> Response | None:
    if _scope(request, token) is None:
        return _page(request, "sign_in.html", "Sign in", status=401)
    return None


def _kept(response: Response, token: str | None) -> Response:
    if token:
        response.set_cookie(COOKIE, token, httponly=True, samesite="strict")
    return response


Token = Annotated[str | None, Query(description="a token of scheduler_api_tokens")]


@router.get("/", response_class=HTMLResponse)
def overview(request: Request, token: Token = None) -> Response:
    refused = _guard(request, token)
    if refused is not None:
        return refused
    scheduler = client(request)
    try:
        now = scheduler.clock()
        count = scheduler.task_log.partitions()
        views = partitions(count, scheduler.store, now)
        coming = due_soon(count, scheduler.store, now)
    except SchedulerError as exc:
        return _message(request, "Partitions", str(exc), 503)
    rows = [(v.partition, v.owner or "-", v.epoch, "held" if v.leased else "free", v.pending,
             v.oldest or "-", f"{v.overdue_seconds:.0f}s" if v.overdue_seconds else "-")
            for v in views]
    # what falls due next, a bar per bucket (a div as wide as its share)
    most = max([tasks for _, tasks in coming.buckets] + [1])
    bars = [(start, tasks, 20 * tasks / most) for start, tasks in coming.buckets]
    return _kept(_page(request, "overview.html", "Partitions", rows=rows,
                       css=["late" if v.overdue_seconds > 60 else "" for v in views],
                       pending=sum(v.pending for v in views),
                       leased=sum(1 for v in views if v.leased), coming=coming, bars=bars), token)


@router.get("/find")
def find(ordering_id: str, at: str, unique: str) -> Response:
    return RedirectResponse(f"/tasks/{segments(ordering_id, at, unique)}", status_code=303)


@router.get("/tasks/{ordering_id}/{at}/{unique}", response_class=HTMLResponse)
def task_page(ordering_id: KeyPart, at: str, unique: KeyPart, request: Request, token: Token = None
              ) -> Response:
    refused = _guard(request, token)
    if refused is not None:
        return refused
    try:
        key = task_key(ordering_id, at, unique)
        scheduler = client(request)
        described = describe_key(scheduler.store, key, scheduler.clock())
    except SchedulerError as exc:
        return _message(request, "Task", str(exc), 422)
    if described is None:
        return _message(request, str(key), "Unknown: never stored, or its status expired.", 404)
    actions = described.pop("operator_actions", None) or []
    rows = [(name, value) for name, value in described.items() if value is not None]
    movable = described["state"] == "pending" and not described["attempts"]
    return _kept(_page(request, "task.html", str(key), rows=rows, actions=actions,
                       path=segments(ordering_id, at, unique),
                       movable=movable and _may_write(request, token)), token)


@router.get("/ordering-ids", response_class=HTMLResponse)
def ordering_id_search(request: Request, token: Token = None,
                       ordering_id: Annotated[str | None, Query(max_length=512)] = None) -> Response:
    refused = _guard(request, token)
    if refused is not None:
        return refused
    if ordering_id:
        return RedirectResponse(f"/ordering-ids/{segments(ordering_id)}", status_code=303)
    return _kept(_page(request, "ordering_ids.html", "Ordering ids"), token)


@router.get("/ordering-ids/{ordering_id}", response_class=HTMLResponse)
def timeline(ordering_id: KeyPart, request: Request, token: Token = None) -> Response:
    """An ordering id's tasks still in the schedule, in the order they will run."""
    refused = _guard(request, token)
    if refused is not None:
        return refused
    scheduler = client(request)
    title = f"Ordering id {ordering_id}"
    try:
        tasks = ordering_id_tasks(scheduler.store, scheduler.task_log.partitions(), ordering_id)
    except SchedulerError as exc:
        return _message(request, title, str(exc), 422)
    shown = [{"link": f"/tasks/{segments(ordering_id, task['at'], task['unique'])}",
              "unique": task["unique"],
              "cells": [task["at"], task["task"], task["state"], task["attempts"],
                        waiting_note(task), task["last_error"] or ""]} for task in tasks]
    return _kept(_page(request, "timeline.html", title, tasks=shown, path=segment(ordering_id),
                       writer=_may_write(request, token)), token)


@router.get("/ordering-ids/{ordering_id}/cancel", response_class=HTMLResponse)
def cancel_many_asked(ordering_id: KeyPart, request: Request) -> Response:
    """What cancelling every pending task of an ordering id would do, and the button to."""
    return _cancel_many(ordering_id, request, dry_run=True)


@router.post("/ordering-ids/{ordering_id}/cancel", response_class=HTMLResponse)
def cancel_many_confirmed(ordering_id: KeyPart, request: Request) -> Response:
    """The confirmed bulk cancel: needs the write token in the cookie."""
    return _cancel_many(ordering_id, request, dry_run=False)


def _cancel_many(ordering_id: str, request: Request, dry_run: bool) -> Response:
    title = f"Cancel the pending tasks of {ordering_id}"
    if not _may_write(request):
        return _message(request, title, "Cancelling needs a write token of scheduler_api_tokens.",
                        403)
    try:
        report = cancel_many(client(request), Selection(ordering_id=ordering_id), dry_run=dry_run,
                             by="console")
    except SchedulerError as exc:
        return _message(request, title, str(exc), 503 if dry_run else 422)
    return _page(request, "cancel_many.html", title, report=report, summary=report.summary(),
                 path=segment(ordering_id), examples={
                     kind: [str(key) for key in keys] for kind, keys in report.examples.items()})


@router.get("/attention", response_class=HTMLResponse)
def attention(request: Request, token: Token = None) -> Response:
    """Tasks that failed (the blocked ones hold their ordering id), oldest first."""
    refused = _guard(request, token)
    if refused is not None:
        return refused
    scheduler = client(request)
    try:
        failed = tasks_in_state(scheduler.store, scheduler.task_log.partitions(), "failed", 200)
    except SchedulerError as exc:
        return _message(request, "Failed and blocked", str(exc), 503)
    shown = [{"path": segments(task["ordering_id"], task["at"], task["unique"]),
              "ordering_id": task["ordering_id"], "unique": task["unique"],
              "blocked": task["note"].startswith("blocked"),
              "cells": [task["at"], task["task"], task["attempts"], task["note"],
                        task["last_error"] or ""]} for task in failed]
    return _kept(_page(request, "attention.html", "Failed and blocked", failed=shown,
                       writer=_may_write(request, token)), token)


@router.post("/tasks/{ordering_id}/{at}/{unique}/cancel")
def cancel_from_page(ordering_id: KeyPart, at: str, unique: KeyPart, request: Request) -> Response:
    """The cancel button: needs the write token in the cookie; back to the list after."""
    if not _may_write(request):
        return _message(request, "Cancel", "Cancelling needs a write token of "
                                           "scheduler_api_tokens.", 403)
    scheduler = client(request)
    try:
        request_cancel(scheduler, task_key(ordering_id, at, unique), by="console")
    except SchedulerError as exc:
        return _message(request, "Cancel", str(exc), 503)
    return RedirectResponse("/attention", status_code=303)


@router.post("/tasks/{ordering_id}/{at}/{unique}/retry")
def retry_from_page(ordering_id: KeyPart, at: str, unique: KeyPart, request: Request) -> Response:
    """The retry button: needs the write token in the cookie; back to the list after."""
    if not _may_write(request):
        return _message(request, "Retry", "Retrying needs a write token of "
                                          "scheduler_api_tokens.", 403)
    try:
        request_retry(client(request), task_key(ordering_id, at, unique), by="console")
    except NotRetryableError as exc:
        return _message(request, "Retry", str(exc), 409)
    except SchedulerError as exc:
        return _message(request, "Retry", str(exc), 503)
    return RedirectResponse("/attention", status_code=303)


@router.post("/tasks/{ordering_id}/{at}/{unique}/reschedule")
async def reschedule_from_page(ordering_id: KeyPart, at: str, unique: KeyPart, request: Request
                               ) -> Response:
    """The task page's "Move to" form: a new time (ISO 8601, UTC if no offset); needs the
    write token in the cookie; to the new key's page after."""
    from urllib.parse import parse_qs

    from celery_scheduler.reschedules import new_time_ms, request_reschedule

    if not _may_write(request):
        return _message(request, "Reschedule", "Rescheduling needs a write token of "
                                               "scheduler_api_tokens.", 403)
    form = parse_qs((await request.body()).decode("utf-8", "replace"))
    to = (form.get("to") or [""])[0].strip()
    scheduler = client(request)
    try:
        when = dt.datetime.fromisoformat(to.replace("Z", "+00:00"))
    except ValueError:
        return _message(request, "Reschedule", f"{to!r:.60} is not an ISO 8601 time, such as "
                                               "2030-01-01T09:30:00Z", 422)
    try:
        moved = request_reschedule(scheduler, task_key(ordering_id, at, unique),
                                   new_time_ms(when, None, scheduler.clock()), by="console")
    except NotReschedulableError as exc:
        return _message(request, "Reschedule", str(exc), 409)
    except ScheduleError as exc:
        return _message(request, "Reschedule", str(exc), 422)
    except SchedulerError as exc:
        return _message(request, "Reschedule", str(exc), 503)
    new = moved.key
    path = segments(new.ordering_id, new.scheduled_at.isoformat(), new.uniqueness_key)
    return RedirectResponse(f"/tasks/{path}", status_code=303)


@router.get("/dead-letters", response_class=HTMLResponse)
def dead_letters_page(request: Request, token: Token = None,
                      reason: Annotated[str | None, Query(max_length=200)] = None) -> Response:
    refused = _guard(request, token)
    if refused is not None:
        return refused
    try:
        letters = list(read_dead_letters(client(request).settings, reason))[:500]
    except SchedulerError as exc:
        return _message(request, "Dead letters", str(exc), 503)
    rows = [(letter.offset, letter.source, letter.task or "?", letter.as_json()["key"], letter.reason)
            for letter in letters]
    return _kept(_page(request, "dead_letters.html", "Dead letters", rows=rows), token)


@router.get("/periodic", response_class=HTMLResponse)
def periodic_page(request: Request, token: Token = None) -> Response:
    refused = _guard(request, token)
    if refused is not None:
        return refused
    try:
        views = entry_views(request.app.state.celery_app, client(request))
    except SchedulerError as exc:
        return _message(request, "Periodic entries", str(exc), 503)
    entries = [{"name": v.name, "path": segment(v.name), "state": v.state,
                "late": not v.scheduled_task or v.last_state == "failed",
                "cells": (v.task, v.schedule, v.source, v.state, v.partition, v.catch_up,
                          v.last_fired.isoformat(timespec="seconds") if v.last_fired else "-",
                          v.last_state or "-", v.last_error or "",
                          ", ".join(at.isoformat(timespec="seconds") for at in v.next))}
               for v in views]
    return _kept(_page(request, "periodic.html", "Periodic entries", entries=entries,
                       writer=_may_write(request, token)), token)


@router.post("/periodic/{name}/{action}")
def change_periodic_from_page(name: KeyPart, action: str, request: Request) -> Response:
    """The pause, resume, delete and reset buttons: need the write token in the cookie."""
    if action not in ("pause", "resume", "delete", "reset"):
        return _message(request, "Periodic entries", f"no such action {action!r}", 404)
    if not _may_write(request):
        return _message(request, "Periodic entries", "Changing an entry needs a write token of "
                                                     "scheduler_api_tokens.", 403)
    try:
        getattr(periodic_admin, action)(request.app.state.celery_app, name, by="console")
    except PeriodicEntryError as exc:
        return _message(request, "Periodic entries", str(exc), 404)
    except SchedulerError as exc:
        return _message(request, "Periodic entries", str(exc), 503)
    return RedirectResponse("/periodic", status_code=303)
