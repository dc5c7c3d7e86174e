"""Take the documentation's screenshots (docs/images/*.png).

    python scripts/docs_screenshots.py            # the console and the status table
    python scripts/docs_screenshots.py --flower   # and Flower (needs scripts/services up)

The console and ``celery -A proj scheduler status`` run on the in-memory dispatcher of the
testing helper (the real ingest loop and engine), loaded with a small workload: reminders
for forty customers over the next half hour, some charges that fail and wait for their
retry. For Flower, a worker with task events on Redis runs releases published as a
dispatcher publishes them. Headless Chromium (Debian's ``chromium``) takes each picture.
"""

from __future__ import annotations

import datetime as dt
import html
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import uvicorn
from celery import Celery
from click.testing import CliRunner

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from celery_scheduler import release as releasing  # noqa: E402
from celery_scheduler import scheduled_task, wire  # noqa: E402
from celery_scheduler.cli import scheduler as scheduler_command  # noqa: E402
from celery_scheduler.envelope import ScheduleEnvelope  # noqa: E402
from celery_scheduler.keys import TaskKey  # noqa: E402
from celery_scheduler.testing import scheduler_testing  # noqa: E402
from celery_scheduler.web import create_app  # noqa: E402

TOKEN = "docs-read-token-0123456789"
OUT = REPO / "docs" / "images"

app = Celery("proj", broker="memory://", set_as_current=False)
app.conf.scheduler_api_tokens = {TOKEN: "read"}


@scheduled_task(ordering_id="customer_id", uniqueness_key="step")
@app.task(name="proj.send_reminder")
def send_reminder(customer_id: str, step: str) -> None:
    pass


@scheduled_task(ordering_id="customer_id", uniqueness_key="invoice", max_attempts=5,
                retry_backoff=300.0)
@app.task(name="proj.charge")
def charge(customer_id: str, invoice: str) -> None:
    raise RuntimeError("card declined")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _shoot(browser: str, url: str, name: str, size: str = "1280,900") -> None:
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--virtual-time-budget=5000", f"--screenshot={OUT / name}",
                    f"--window-size={size}", url],
                   check=True, capture_output=True, timeout=120)
    print(f"wrote {OUT / name}")


def _terminal(browser: str, command: str, output: str, name: str) -> None:
    """A picture of *command* and its *output* as a terminal shows them."""
    page = Path(tempfile.mkdtemp()) / "terminal.html"
    page.write_text(
        "<html><body style='margin:0;background:#1e1e1e'><pre style='margin:0;padding:16px;"
        "color:#e6e6e6;font:14px/1.4 monospace'><span style='color:#8ae234'>$</span> "
        f"{html.escape(command)}\n{html.escape(output)}</pre></body></html>")
    lines = output.count("\n") + 2
    _shoot(browser, page.as_uri(), name, f"1100,{32 + 20 * lines}")


FLOWER_APP = '''
    import os
    from celery import Celery
    from celery_scheduler import scheduled_task

    app = Celery("proj", broker=os.environ["DOCS_BROKER"])
    app.conf.task_default_queue = os.environ["DOCS_QUEUE"]

    @scheduled_task(ordering_id="customer_id", uniqueness_key="step")
    @app.task(name="proj.send_reminder")
    def send_reminder(customer_id, step):
        return f"{step} sent to {customer_id}"
'''


def flower(browser: str) -> None:
    """Flower's tasks page with releases run by a worker (Redis from scripts/services)."""
    home = Path(tempfile.mkdtemp())
    (home / "flowerproj.py").write_text(textwrap.dedent(FLOWER_APP))
    queue = f"docs-{os.getpid()}"
    env = {**os.environ, "DOCS_BROKER": "redis://127.0.0.1:6379/9", "DOCS_QUEUE": queue,
           "PYTHONPATH": str(home), "FLOWER_UNAUTHENTICATED_API": "true"}
    port = _free_port()
    celery = [sys.executable, "-m", "celery", "-A", "flowerproj"]
    processes = [subprocess.Popen([*celery, "worker", "-E", "--pool=solo", "-Q", queue,
                                   "--loglevel=WARNING"], cwd=home, env=env),
                 subprocess.Popen([*celery, "flower", f"--port={port}", "--address=127.0.0.1",
                                   "--logging=warning"], cwd=home, env=env)]
    try:
        sys.path.insert(0, str(home))
        os.environ.update(DOCS_BROKER=env["DOCS_BROKER"], DOCS_QUEUE=queue)
        import flowerproj  # type: ignore[import-not-found]

        time.sleep(8)  # the worker starts, and Flower subscribes to its events
        now = int(time.time() * 1000)
        for n in range(6):
            key = TaskKey(f"customer-{n:02d}", now + n * 1000, "step-1")
            envelope = ScheduleEnvelope(key, "proj.send_reminder", [key.ordering_id, "step-1"])
            release = wire.Release(key, n % 12, 1, 1, now + 300_000)
            releasing.publish(flowerproj.app, envelope, release)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/tasks", timeout=5) as answer:
                if answer.read().count(b'"SUCCESS"') >= 6:
                    break
            time.sleep(0.5)
        _shoot(browser, f"http://127.0.0.1:{port}/tasks", "flower-tasks.png", "1400,600")
    finally:
        for process in processes:
            process.terminate()
            process.wait(30)


def main() -> int:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        print("chromium is not installed (scripts/debian-install chromium)", file=sys.stderr)
        return 1
    OUT.mkdir(parents=True, exist_ok=True)
    start = dt.datetime(2030, 1, 1, 9, 0, tzinfo=dt.timezone.utc)
    with scheduler_testing(app, start=start) as scheduler:
        for n in range(40):
            for step in range(5):
                send_reminder.schedule_in(60 * (n % 7) + 300 * step + 90, f"customer-{n:02d}",
                                          f"step-{step}")
        charge.schedule_in(30, "customer-07", "inv-2030-001")
        charge.schedule_in(40, "customer-07", "inv-2030-002")
        scheduler.advance(60)  # the first charge fails, and waits for its retry
        server = uvicorn.Server(uvicorn.Config(create_app(app), host="127.0.0.1",
                                               port=_free_port(), log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.05)
        base = f"http://127.0.0.1:{server.config.port}"
        pages = {"console-overview.png": f"{base}/?token={TOKEN}",
                 "console-timeline.png": f"{base}/ordering-ids/customer-07?token={TOKEN}"}
        for name, url in pages.items():
            _shoot(browser, url, name)
        server.should_exit = True
        thread.join(timeout=10)
        result = CliRunner().invoke(scheduler_command, ["status", "--no-lag"],
                                    obj=SimpleNamespace(app=app))
        if result.exit_code != 0:
            print(result.output, file=sys.stderr)
            return 1
        _terminal(browser, "celery -A proj scheduler status --no-lag", result.output,
                  "cli-status.png")
    if "--flower" in sys.argv[1:]:
        flower(browser)
    return 0


if __name__ == "__main__":
    sys.exit(main())
