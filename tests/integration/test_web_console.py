"""The web console and HTTP API against the real Kafka, Cassandra, a dispatcher and a worker:
the API fuzzed from its own OpenAPI document, and the pages opened in headless Chromium."""

from __future__ import annotations

import datetime as dt
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
    assert operations == 9 and len(answered) >= operations * 5, (operations, len(answered))
    assert any(200 <= status < 300 for status in answered)  # not only refusals


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

    port = _free_port()
    server = subprocess.Popen(
        [scheduler.python, "-m", "uvicorn", "--factory", "tests.integration.console_app:make",
         "--host", "127.0.0.1", "--port", str(port)],
        cwd=scheduler.cwd, env={**scheduler.env, "CONSOLE_TOKENS": f"{READ_TOKEN}=read"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    scheduler.processes.append(server)
    base = f"http://127.0.0.1:{port}"
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
