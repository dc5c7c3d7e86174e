"""The web console and HTTP API of a scheduler deployment: ``celery -A proj scheduler serve``.

::

    app.conf.scheduler_api_tokens = {"a-long-read-token...": "read", "a-long-write-token...": "write"}

    celery -A proj scheduler serve --port 8000    # pages at /, the API at /api/v1, /docs

Needs the ``web`` extra (``pip install 'celery-scheduler[web]'``: FastAPI, uvicorn, Jinja2). The
OpenAPI document is at ``/openapi.json``; the pages read the token from the ``token`` query
parameter once and keep it in a cookie.
"""

from __future__ import annotations

from typing import Any

try:
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException
except ImportError as exc:  # pragma: no cover - depends on the extra
    raise ImportError("the web console needs the web extra: pip install 'celery-scheduler[web]'") from exc

from celery_scheduler import __version__
from celery_scheduler.client import get_client
from celery_scheduler.errors import (
    NotAScheduledTaskError,
    NotReschedulableError,
    NotRetryableError,
    ScheduleError,
    SchedulerError,
    ScheduleStoreError,
    TaskLogError,
)

__all__ = ["create_app"]


def _status(exc: SchedulerError) -> int:
    if isinstance(exc, NotAScheduledTaskError):
        return 404
    if isinstance(exc, (NotRetryableError, NotReschedulableError)):
        return 409  # the request is fine; the task's state does not allow it
    if isinstance(exc, ScheduleError):
        return 422
    if isinstance(exc, (TaskLogError, ScheduleStoreError)):
        return 503
    return 422


def create_app(celery_app: Any) -> FastAPI:
    """The ASGI application serving *celery_app*'s scheduler (its settings and tasks)."""
    from celery_scheduler.web import (
        api,
        audit,
        bulk,
        limiting,
        pages,
        pause_pages,
        pausing,
        periodic,
        views,
    )
    from celery_scheduler.web.paths import KeepSlashes

    web = FastAPI(title="celery_scheduler", version=__version__,
                  description="Schedule, cancel and look at scheduled Celery tasks.")
    web.state.client = get_client(celery_app)
    web.state.celery_app = celery_app  # its beat_schedule, for the periodic entries
    web.add_middleware(KeepSlashes)  # a key part with "/" in it routes as one segment
    web.include_router(api.router)
    web.include_router(views.router)
    web.include_router(periodic.router)
    web.include_router(bulk.router)
    web.include_router(pausing.router)
    web.include_router(limiting.router)
    web.include_router(audit.router)
    web.include_router(pages.router)
    web.include_router(pause_pages.router)
    web.include_router(audit.pages)

    @web.exception_handler(SchedulerError)
    def scheduler_error(request: Request, exc: SchedulerError) -> JSONResponse:
        return JSONResponse({"error": type(exc).__name__, "message": str(exc)},
                            status_code=_status(exc))

    @web.exception_handler(HTTPException)
    def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        names = {401: "Unauthorized", 403: "Forbidden", 404: "NotFound"}
        return JSONResponse({"error": names.get(exc.status_code, "HTTPError"), "message": str(exc.detail)},
                            status_code=exc.status_code, headers=exc.headers)

    @web.exception_handler(RequestValidationError)
    def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        where = "; ".join(f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}"
                          for error in exc.errors())
        return JSONResponse({"error": "InvalidRequest", "message": where}, status_code=422)

    return web
