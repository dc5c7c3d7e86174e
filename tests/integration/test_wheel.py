"""The distributions users get: built, checked, installed with pip and used from there.

``python -m build`` makes the sdist and, from it, the wheel; ``twine check`` reads their
metadata as PyPI would. The wheel is then installed with pip into a new virtual
environment (not editable, without this interpreter's site-packages), and an app written
into a directory outside the checkout is run from there: ``celery -A wheelapp scheduler
init``, a dispatcher, a worker, and one task scheduled, run and its result read back,
every process that environment's Python. The checkout is never on their import path.

pip downloads the wheel's dependencies on the first run; its cache serves later ones.
"""

from __future__ import annotations

import email
import json
import os
import subprocess
import sys
import textwrap
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import celery_scheduler
from tests.integration.dispatch_fixtures import AppProcesses
from tests.services import REPO, drop_scheduler

pytestmark = [pytest.mark.kafka, pytest.mark.cassandra, pytest.mark.redis, pytest.mark.timeout(240)]

# extra -> the modules it must make importable: its libraries, and our modules that need them
EXTRAS = {
    "monitoring": ["prometheus_client", "flower", "celery_scheduler.metrics"],
    "web": ["fastapi", "uvicorn", "jinja2", "celery_scheduler.web.api", "celery_scheduler.web.pages"],
    "opentelemetry": ["opentelemetry.trace", "opentelemetry.propagate", "celery_scheduler.tracing"],
}

APP = '''
import os
import pathlib

from celery import Celery

from celery_scheduler import scheduled_task

app = Celery("wheelapp", broker=os.environ["WHEEL_REDIS"] + "/1", backend=os.environ["WHEEL_REDIS"] + "/2")
app.conf.update(
    scheduler_kafka_bootstrap_servers=os.environ["WHEEL_KAFKA"],
    scheduler_kafka_topic=os.environ["WHEEL_NAME"],
    scheduler_kafka_partitions=2,
    scheduler_cassandra_keyspace=os.environ["WHEEL_NAME"],
    scheduler_cassandra_consistency="ONE",
    scheduler_cassandra_serial_consistency="SERIAL",
    task_default_queue=os.environ["WHEEL_NAME"],
    broker_connection_retry_on_startup=True,
)


@scheduled_task(ordering_id="customer", uniqueness_key="step")
@app.task(name="wheelapp.greet")
def greet(customer: str, step: str) -> str:
    pathlib.Path(os.environ["WHEEL_RAN"]).write_text(f"{customer}:{step}")
    return f"hello {customer}"
'''

# Run by the installed package: schedule one task, wait for its result and final status.
SCHEDULE = '''
import json
import time

import celery_scheduler
import wheelapp

handle = wheelapp.greet.schedule_in(1, "customer-42", step="welcome")
value = handle.result().get(timeout=60)
deadline = time.monotonic() + 30
while (status := handle.status()) is None or status.state.value != "succeeded":
    if time.monotonic() > deadline:
        break
    time.sleep(0.2)
print(json.dumps({"file": celery_scheduler.__file__, "version": celery_scheduler.__version__,
                  "result": value, "state": status and status.state.value}))
'''


def run(*argv: str | Path, cwd: Path = REPO, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=180)
    assert result.returncode == 0, f"{argv} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and the wheel built from the checkout, checked by twine."""
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--outdir", out, REPO)
    run(sys.executable, "-m", "twine", "check", "--strict", *sorted(out.iterdir()))
    return out


def test_the_wheel_holds_the_package_its_data_and_its_metadata(dist: Path) -> None:
    [wheel] = dist.glob("*.whl")
    [sdist] = dist.glob("*.tar.gz")
    version = celery_scheduler.__version__
    assert wheel.name == f"celery_scheduler-{version}-py3-none-any.whl"
    assert sdist.name == f"celery_scheduler-{version}.tar.gz"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = f"celery_scheduler-{version}.dist-info"
        metadata = email.message_from_string(archive.read(f"{info}/METADATA").decode())
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
    assert "celery_scheduler/py.typed" in names
    assert {"celery_scheduler/web/templates/base.html",
            "celery_scheduler/web/templates/attention.html"} <= names  # the console's pages
    assert "celery_scheduler/dispatcher/engine.py" in names and "celery_scheduler/store/schema.py" in names
    assert not any(name.startswith(("tests/", "examples/", "benchmarks/")) for name in names)
    assert f"{info}/licenses/LICENSE" in names
    assert metadata["Name"] == "celery-scheduler" and metadata["Version"] == version
    assert metadata["License-Expression"] == "Apache-2.0"
    # each extra is declared, and brings what the README promises
    assert set(metadata.get_all("Provides-Extra")) >= {"monitoring", "dev", "bench"}
    requires = metadata.get_all("Requires-Dist")
    for needed in ("prometheus-client>=0.19", "flower>=2.0"):
        assert f'{needed}; extra == "monitoring"' in requires
    assert "confluent-kafka>=2.3" in requires and "cassandra-driver>=3.29" in requires
    assert "scheduler = celery_scheduler.cli:scheduler" in entry_points


@pytest.fixture(scope="module")
def installed(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtual environment with the wheel installed by pip; returns its python."""
    home = tmp_path_factory.mktemp("venv")
    venv.create(home, with_pip=True, system_site_packages=False)
    python = home / "bin" / "python"
    [wheel] = dist.glob("*.whl")
    # with the extras a deployment uses (not dev, spark or bench: test and batch tooling)
    run(python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
        f"{wheel}[{','.join(EXTRAS)}]", cwd=home)
    return python


def test_the_extras_install_what_they_promise(installed: Path) -> None:
    for extra, modules in EXTRAS.items():
        code = "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]"
        result = subprocess.run([installed, "-c", code, *modules], capture_output=True, text=True,
                                timeout=120, cwd=installed.parent)
        assert result.returncode == 0, f"extra {extra!r}: {result.stderr[-2000:]}"


@pytest.fixture
def wheel_app(installed: Path, kafka_bootstrap: str, cassandra_contact: str, redis_url: str,
              unique_name: str, tmp_path: Path) -> Iterator[AppProcesses]:
    directory = tmp_path / "app"
    directory.mkdir()
    (directory / "wheelapp.py").write_text(textwrap.dedent(APP))
    # nothing of the checkout: no PYTHONPATH, no active virtual environment
    env = {name: value for name, value in os.environ.items() if name not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(WHEEL_REDIS=redis_url, WHEEL_KAFKA=kafka_bootstrap, WHEEL_NAME=unique_name,
               WHEEL_RAN=str(tmp_path / "ran"))
    processes = AppProcesses(env, execlog=tmp_path / "none", tmp=tmp_path, python=str(installed),
                             cwd=directory, app="wheelapp")
    yield processes
    processes.stop_all(kill_workers=True)
    drop_scheduler(unique_name, unique_name)


def test_an_app_runs_a_scheduled_task_with_the_installed_wheel(wheel_app: AppProcesses,
                                                                tmp_path: Path) -> None:
    wheel_app.init()
    wheel_app.start(wheel_app.env["WHEEL_NAME"])

    (wheel_app.cwd / "schedule.py").write_text(textwrap.dedent(SCHEDULE))
    output = run(wheel_app.python, "schedule.py", cwd=wheel_app.cwd, env=wheel_app.env).stdout
    report = json.loads(output.strip().splitlines()[-1])

    venv_home = Path(wheel_app.python).parent.parent
    assert Path(report["file"]).resolve().is_relative_to(venv_home.resolve())  # not the checkout
    assert not Path(report["file"]).resolve().is_relative_to(REPO)
    assert report["version"] == celery_scheduler.__version__
    assert report["result"] == "hello customer-42"
    assert (tmp_path / "ran").read_text() == "customer-42:welcome"
    assert report["state"] == "succeeded"
