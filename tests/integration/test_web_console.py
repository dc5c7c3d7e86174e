"""The web console and HTTP API against the real Kafka, Cassandra, a dispatcher and a worker:
the API fuzzed from its own OpenAPI document, and the pages opened in headless Chromium."""

from __future__ import annotations

import datetime as dt
import html.parser
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from schemathesis import checks

from celery_scheduler.web import create_app
from celery_scheduler.web.paths import segments
from tests.integration.dispatch_fixtures import Scheduler
from tests.integration.test_flower import chromium

pytestmark = [pytest.mark.kafka, pytest.mark.cassandra, pytest.mark.redis]
UTC = dt.timezone.utc
WRITE_TOKEN = "write-token-for-the-console-tests"
READ_TOKEN = "read-token-for-the-console-tests"
TOKENS = {WRITE_TOKEN: "write", READ_TOKEN: "read"}


@pytest.fixture
def console(scheduler: Scheduler, schedule: Any) -> Iterator[Any]:
    """The test app's web application, on this test's topic and keyspace, with tokens."""
    client = schedule.record.client
    client.settings = client.settings.replace(api_tokens=TOKENS)
    yield create_app(schedule.app)


def test_the_api_answers_every_generated_request_with_a_documented_status(
        scheduler: Scheduler, console: Any) -> None:
    scheduler.dispatcher()
    schema = schemathesis.openapi.from_asgi("/openapi.json", console)
    headers = {"Authorization": f"Bearer {WRITE_TOKEN}"}
    answered: list[int] = []
    operations = 0
    for result in schema.get_all_operations():
        operations += 1
        operation = result.ok()

        # no 500s, and every answer is one the OpenAPI document describes (a request the
        # schema allows may still be refused: an unknown task, a time in the past)
        @settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck),
                  database=None)
        @given(case=operation.as_strategy())
        def check(case: Any) -> None:
            response = case.call_and_validate(headers=headers, checks=[
                checks.not_a_server_error, checks.status_code_conformance,
                checks.content_type_conformance, checks.response_schema_conformance])
            answered.append(response.status_code)

        check()
    # every route of celery_scheduler/web/api.py: ten on tasks and partitions, four on
    # periodic entries; web/bulk.py's cancel-many; web/pausing.py's three; web/limiting.py's three;
    # web/audit.py's one
    assert operations == 22 and len(answered) >= operations * 5, (operations, len(answered))
    assert any(200 <= status < 300 for status in answered)  # not only refusals


def _console_server(scheduler: Scheduler, browser: str, tokens: str
                    ) -> tuple[str, Callable[[str], str]]:
    """The console served by uvicorn in a process of its own (with *tokens*, TOKEN=SCOPE,...),
    and a function giving the DOM of one of its URLs as Chromium built it."""
    port = _free_port()
    server = subprocess.Popen(
        [scheduler.python, "-m", "uvicorn", "--factory", "tests.integration.console_app:make",
         "--host", "127.0.0.1", "--port", str(port)],
        cwd=scheduler.cwd, env={**scheduler.env, "CONSOLE_TOKENS": tokens},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    scheduler.processes.append(server)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline and server.poll() is None, "the console did not start"
            time.sleep(0.2)

    def dom(url: str) -> str:
        return subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                               "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout

    return f"http://127.0.0.1:{port}", dom


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def test_the_pages_show_partitions_a_task_a_timeline_and_refuse_without_a_token(
        scheduler: Scheduler, schedule: Callable[..., Any], console: Any, tmp_path: Any) -> None:
    browser = chromium()
    scheduler.dispatcher()
    later = dt.datetime.now(UTC).replace(microsecond=0) + dt.timedelta(hours=1)
    handle = schedule.record.schedule_at(later, "console-1", 5, scheduled_for=later.timestamp())
    http = TestClient(console)
    deadline = time.monotonic() + 30
    path = f"/api/v1/tasks/console-1/{later.isoformat()}/seq-5"
    while http.get(path, headers={"Authorization": f"Bearer {READ_TOKEN}"}).status_code != 200:
        assert time.monotonic() < deadline, "the dispatcher did not store the task"
        time.sleep(0.5)

    base, dom = _console_server(scheduler, browser, f"{READ_TOKEN}=read")

    assert "Open this page with" in dom(f"{base}/")  # no token: refused
    overview = dom(f"{base}/?token={READ_TOKEN}")
    assert "1 task(s) in the schedule" in overview and "partitions leased" in overview
    assert "Due soon" in overview and "0 task(s) overdue" in overview
    task = dom(f"{base}/tasks/console-1/{later.isoformat()}/seq-5?token={READ_TOKEN}")
    assert handle.task_id in task and "dispatching.record" in task and "pending" in task
    timeline = dom(f"{base}/ordering-ids/console-1?token={READ_TOKEN}")
    assert "1 task(s) waiting" in timeline and "seq-5" in timeline and later.isoformat() in timeline
    shot = tmp_path / "console.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
                    "--window-size=1200,800", f"{base}/?token={READ_TOKEN}"],
                   capture_output=True, timeout=120, check=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# Text a producer may choose, made to run script or break markup if written unescaped, with
# "/" in the ordering id (one segment of the console's paths all the same).
HOSTILE_ID = "tenant/7</td><svg onload=\"document.body.setAttribute('data-pwned','id')\">\"'&<b>"
HOSTILE_TEXT = "<img src=x onerror=\"document.body.setAttribute('data-pwned','text')\">'<"


class _Cells(html.parser.HTMLParser):
    """The text of every heading, table cell and link of a page, as a reader sees it."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: list[str] = []
        self._open: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        if tag in ("h1", "td", "a"):
            self._open = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("h1", "td", "a") and self._open is not None:
            self.cells.append("".join(self._open))
            self._open = None

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self._open.append(data)


def _cells(page: str) -> list[str]:
    parser = _Cells()
    parser.feed(page)
    return parser.cells


def test_the_pages_show_hostile_keys_arguments_and_errors_as_text(
        scheduler: Scheduler, schedule: Any, console: Any) -> None:
    browser = chromium()
    scheduler.dispatcher()
    scheduler.worker()
    now = dt.datetime.now(UTC).replace(microsecond=0)
    # one fails at once with the text as its error (blocking its ordering id), one waits
    failing = schedule.fail_with.schedule_at(now + dt.timedelta(seconds=2), HOSTILE_ID, HOSTILE_TEXT)
    waiting = schedule.fail_with.schedule_at(now + dt.timedelta(hours=1), HOSTILE_ID, HOSTILE_TEXT + "!")
    deadline = time.monotonic() + 60
    while (status := failing.status()) is None or status.state != "failed":
        assert time.monotonic() < deadline, f"the task did not fail: {status}"
        time.sleep(0.5)
    assert status.last_error is not None and status.last_error.endswith(HOSTILE_TEXT)
    base, dom = _console_server(scheduler, browser, f"{WRITE_TOKEN}=write")

    def at(handle: Any) -> str:
        key = handle.key
        return segments(key.ordering_id, key.scheduled_at.isoformat(), key.uniqueness_key)

    pages = {"failed task": f"/tasks/{at(failing)}", "waiting task": f"/tasks/{at(waiting)}",
             "timeline": f"/ordering-ids/{segments(HOSTILE_ID)}", "attention": "/attention"}
    for name, path in pages.items():
        page = dom(f"{base}{path}?token={WRITE_TOKEN}")
        assert "</nav>" in page, f"{name}: not the console's page: {page[:500]}"
        # then: no script ran, and each value is one cell's whole text
        assert "data-pwned=" not in page, f"{name}: the hostile text ran as script"
        assert not any(tag in page for tag in ("<b>", "<img", "<svg")), \
            f"{name}: the hostile text became markup"
        cells = _cells(page)
        # (a task's page shows its key as a mapping, the ordering id in it as a repr)
        assert any(HOSTILE_ID in cell or repr(HOSTILE_ID) in cell for cell in cells), \
            f"{name}: {cells}"
    attention_cells = _cells(dom(f"{base}/attention?token={WRITE_TOKEN}"))
    assert f"{HOSTILE_ID} #u-{HOSTILE_TEXT}" in attention_cells
    assert any(cell.endswith(HOSTILE_TEXT) for cell in attention_cells)  # its last error
    timeline_cells = _cells(dom(f"{base}{pages['timeline']}?token={WRITE_TOKEN}"))
    assert f"u-{HOSTILE_TEXT}!" in timeline_cells  # the waiting one, linked by its own key
