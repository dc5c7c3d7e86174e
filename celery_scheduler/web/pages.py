"""The console's pages: partitions and what falls due next, an ordering id's timeline, the
failed and blocked tasks, one task key, the dead letters.

Plain server-rendered HTML (no scripts): a ``read`` token opens them, given once as
``?token=...`` and kept in a cookie (same-site only). With a ``write`` token the failed and
blocked page also has a cancel button per blocked task.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from celery_scheduler.envelope import CancelEnvelope
from celery_scheduler.errors import NotRetryableError, SchedulerError
from celery_scheduler.operations import (
    DueSoon,
    describe_key,
    due_soon,
    ordering_id_tasks,
    partitions,
    read_dead_letters,
    request_retry,
    tasks_in_state,
    waiting_note,
)
from celery_scheduler.web.api import client, task_key

__all__ = ["router"]

COOKIE = "celery_scheduler_token"
router = APIRouter(include_in_schema=False)

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem; color: #222; }
nav a { margin-right: 1.5rem; }
table { border-collapse: collapse; margin: 1rem 0; }
th, td { border: 1px solid #ccc; padding: .3rem .7rem; text-align: left; }
th { background: #f2f2f2; }
.late { color: #b00020; font-weight: bold; }
.bar { background: #4a7bd0; height: .8rem; }
form input { margin-right: .5rem; }
"""


def _page(title: str, body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)} · "
        f"celery_scheduler</title><style>{_STYLE}</style></head><body>"
        "<nav><a href='/'>Partitions</a><a href='/ordering-ids'>Ordering ids</a>"
        "<a href='/attention'>Failed and blocked</a>"
        "<a href='/dead-letters'>Dead letters</a>"
        "<a href='/docs'>API</a></nav>"
        f"<h1>{html.escape(title)}</h1>{body}</body></html>", status_code=status)


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]], css: Sequence[str] = ()) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    lines = []
    for index, row in enumerate(rows):
        style = f" class='{css[index]}'" if index < len(css) and css[index] else ""
        cells = "".join(f"<td>{html.escape('' if cell is None else str(cell))}</td>" for cell in row)
        lines.append(f"<tr{style}>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(lines)}</table>"


def _allowed(request: Request, token: str | None) -> tuple[bool, str | None]:
    """Whether the request may read, and a token to keep in the cookie."""
    tokens = client(request).settings.api_tokens
    given = token or request.cookies.get(COOKIE)
    return given is not None and given in tokens, token


def _may_write(request: Request, token: str | None = None) -> bool:
    given = token or request.cookies.get(COOKIE)
    return given is not None and client(request).settings.api_tokens.get(given) == "write"


def _guard(request: Request, token: str | None) -> Response | None:
    allowed, _ = _allowed(request, token)
    if not allowed:
        return _page("Sign in", "<p>Open this page with <code>?token=</code> and a token of "
                                "<code>scheduler_api_tokens</code>.</p>", status=401)
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
        return _page("Partitions", f"<p>{html.escape(str(exc))}</p>", status=503)
    rows = [(v.partition, v.owner or "-", v.epoch, "held" if v.leased else "free", v.pending,
             v.oldest or "-", f"{v.overdue_seconds:.0f}s" if v.overdue_seconds else "-")
            for v in views]
    css = ["late" if v.overdue_seconds > 60 else "" for v in views]
    body = (
        f"<p>{sum(v.pending for v in views)} task(s) in the schedule; "
        f"{sum(1 for v in views if v.leased)} of {len(views)} partitions leased.</p>"
        + _table(["partition", "owner", "epoch", "lease", "pending", "oldest", "overdue"], rows, css)
        + _histogram(coming)
        + "<h2>Find a task</h2><form action='/find'>"
        "<input name='ordering_id' placeholder='ordering id' required>"
        "<input name='at' placeholder='2030-01-01T00:00:00Z' required>"
        "<input name='unique' placeholder='uniqueness key' required><button>Show</button></form>")
    return _kept(_page("Partitions", body), token)


def _histogram(coming: DueSoon) -> str:
    """What falls due next, a bar per bucket (plain HTML: a div as wide as its share)."""
    most = max([rows for _, rows in coming.buckets] + [1])
    rows = [(start, count, f"<div class='bar' style='width:{20 * count / most:.1f}rem'></div>")
            for start, count in coming.buckets]
    lines = "".join(f"<tr><td>{html.escape(start)}</td><td>{count}</td><td>{bar}</td></tr>"
                    for start, count, bar in rows)
    return (f"<h2>Due soon</h2><p>{coming.overdue} task(s) overdue; then per "
            f"{coming.bucket_seconds} s:</p><table id='due-soon'><tr><th>from</th><th>tasks</th>"
            f"<th></th></tr>{lines}</table>")


@router.get("/find")
def find(ordering_id: str, at: str, unique: str) -> Response:
    from urllib.parse import quote

    return RedirectResponse(f"/tasks/{quote(ordering_id, safe='')}/{quote(at, safe='')}/"
                            f"{quote(unique, safe='')}", status_code=303)


@router.get("/tasks/{ordering_id}/{at}/{unique}", response_class=HTMLResponse)
def task_page(ordering_id: str, at: str, unique: str, request: Request, token: Token = None
              ) -> Response:
    refused = _guard(request, token)
    if refused is not None:
        return refused
    try:
        key = task_key(ordering_id, at, unique)
        described = describe_key(client(request).store, key)
    except SchedulerError as exc:
        return _page("Task", f"<p>{html.escape(str(exc))}</p>", status=422)
    if described is None:
        return _page(str(key), "<p>Unknown: never stored, or its status expired.</p>", status=404)
    rows = [(name, value) for name, value in described.items() if value is not None]
    return _kept(_page(str(key), _table(["", ""], rows)), token)


@router.get("/ordering-ids", response_class=HTMLResponse)
def ordering_id_search(request: Request, token: Token = None,
                       ordering_id: Annotated[str | None, Query(max_length=512)] = None) -> Response:
    refused = _guard(request, token)
    if refused is not None:
        return refused
    if ordering_id:
        from urllib.parse import quote

        return RedirectResponse(f"/ordering-ids/{quote(ordering_id, safe='')}", status_code=303)
    body = ("<form action='/ordering-ids'><input name='ordering_id' placeholder='ordering id' "
            "required><button>Show its tasks</button></form>")
    return _kept(_page("Ordering ids", body), token)


@router.get("/ordering-ids/{ordering_id}", response_class=HTMLResponse)
def timeline(ordering_id: str, request: Request, token: Token = None) -> Response:
    """An ordering id's tasks still in the schedule, in the order they will run."""
    refused = _guard(request, token)
    if refused is not None:
        return refused
    from urllib.parse import quote

    scheduler = client(request)
    title = f"Ordering id {ordering_id}"
    try:
        tasks = ordering_id_tasks(scheduler.store, scheduler.task_log.partitions(), ordering_id)
    except SchedulerError as exc:
        return _page(title, f"<p>{html.escape(str(exc))}</p>", status=422)
    lines = []
    for task in tasks:
        link = f"/tasks/{quote(ordering_id, safe='')}/{quote(task['at'], safe='')}/" \
               f"{quote(task['unique'], safe='')}"
        cells = [task["at"], task["task"], task["state"], task["attempts"], waiting_note(task),
                 task["last_error"] or ""]
        lines.append(f"<tr><td><a href='{html.escape(link)}'>{html.escape(task['unique'])}</a></td>"
                     + "".join(f"<td>{html.escape(str(cell))}</td>" for cell in cells) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("uniqueness key", "at", "task", "state", "attempts",
                                            "note", "last error"))
    body = (f"<p>{len(tasks)} task(s) waiting, first to run at the top; finished tasks leave the "
            "schedule (see each key's status).</p>"
            f"<table id='timeline'><tr>{head}</tr>{''.join(lines)}</table>")
    return _kept(_page(title, body), token)


@router.get("/attention", response_class=HTMLResponse)
def attention(request: Request, token: Token = None) -> Response:
    """Tasks that failed (the blocked ones hold their ordering id), oldest first."""
    refused = _guard(request, token)
    if refused is not None:
        return refused
    from urllib.parse import quote

    scheduler = client(request)
    try:
        failed = tasks_in_state(scheduler.store, scheduler.task_log.partitions(), "failed", 200)
    except SchedulerError as exc:
        return _page("Failed and blocked", f"<p>{html.escape(str(exc))}</p>", status=503)
    writer = _may_write(request, token)
    lines = []
    for task in failed:
        path = "/".join(quote(task[name], safe="") for name in ("ordering_id", "at", "unique"))
        blocked = task["note"].startswith("blocked")
        button = ""
        if writer:
            button = (f"<form method='post' action='/tasks/{html.escape(path)}/retry'>"
                      "<button>Retry</button></form>")
            if blocked:
                button += (f"<form method='post' action='/tasks/{html.escape(path)}/cancel'>"
                           "<button>Cancel</button></form>")
        cells = [task["at"], task["task"], task["attempts"], task["note"], task["last_error"] or ""]
        lines.append(f"<tr><td><a href='/tasks/{html.escape(path)}'>{html.escape(task['ordering_id'])}"
                     f" #{html.escape(task['unique'])}</a></td>"
                     + "".join(f"<td>{html.escape(str(cell))}</td>" for cell in cells)
                     + f"<td>{button}</td></tr>")
    head = "".join(f"<th>{h}</th>" for h in ("task key", "at", "task", "attempts", "note",
                                            "last error", ""))
    body = (f"<p>{len(failed)} failed task(s) whose status is still kept; a blocked one holds "
            "every later task of its ordering id until it is retried and succeeds, or is cancelled"
            + ("" if writer else " (a write token shows the retry and cancel buttons)") + ".</p>"
            f"<table id='failed'><tr>{head}</tr>{''.join(lines)}</table>")
    return _kept(_page("Failed and blocked", body), token)


@router.post("/tasks/{ordering_id}/{at}/{unique}/cancel")
def cancel_from_page(ordering_id: str, at: str, unique: str, request: Request) -> Response:
    """The cancel button: needs the write token in the cookie; back to the list after."""
    if not _may_write(request):
        return _page("Cancel", "<p>Cancelling needs a write token of "
                               "<code>scheduler_api_tokens</code>.</p>", status=403)
    scheduler = client(request)
    try:
        scheduler.publish(CancelEnvelope(task_key(ordering_id, at, unique), scheduler.clock()))
    except SchedulerError as exc:
        return _page("Cancel", f"<p>{html.escape(str(exc))}</p>", status=503)
    return RedirectResponse("/attention", status_code=303)


@router.post("/tasks/{ordering_id}/{at}/{unique}/retry")
def retry_from_page(ordering_id: str, at: str, unique: str, request: Request) -> Response:
    """The retry button: needs the write token in the cookie; back to the list after."""
    if not _may_write(request):
        return _page("Retry", "<p>Retrying needs a write token of "
                              "<code>scheduler_api_tokens</code>.</p>", status=403)
    try:
        request_retry(client(request), task_key(ordering_id, at, unique))
    except NotRetryableError as exc:
        return _page("Retry", f"<p>{html.escape(str(exc))}</p>", status=409)
    except SchedulerError as exc:
        return _page("Retry", f"<p>{html.escape(str(exc))}</p>", status=503)
    return RedirectResponse("/attention", status_code=303)


@router.get("/dead-letters", response_class=HTMLResponse)
def dead_letters_page(request: Request, token: Token = None,
                      reason: Annotated[str | None, Query(max_length=200)] = None) -> Response:
    refused = _guard(request, token)
    if refused is not None:
        return refused
    try:
        letters = list(read_dead_letters(client(request).settings, reason))[:500]
    except SchedulerError as exc:
        return _page("Dead letters", f"<p>{html.escape(str(exc))}</p>", status=503)
    rows = [(letter.offset, letter.source, letter.task or "?", letter.as_json()["key"], letter.reason)
            for letter in letters]
    body = (f"<p>{len(rows)} dead letter(s). Replay them after the fix with "
            "<code>celery -A proj scheduler dead-letters replay</code>.</p>"
            + _table(["offset", "source", "task", "key", "reason"], rows))
    return _kept(_page("Dead letters", body), token)
