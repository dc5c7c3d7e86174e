"""`scripts/services up` starts a service whose pid file was left by a process that died.

A machine that was reset, or a service killed with SIGKILL, leaves its pid file behind. The
next `up` must not take that file for its own new process: it used to find it at once, see
that its pid was dead and report "exited during start-up" while the real server was still
booting. Each service runs here on a port and state directory of its own, beside the
services the rest of the suite uses.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# service -> (the port variable scripts/services reads, pid file under its state directory)
SERVICES = {
    "redis": ("REDIS_PORT", "redis/redis.pid"),
    "rabbitmq": ("RABBITMQ_PORT", "rabbitmq/rabbitmq.pid"),
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def dead_pid() -> int:
    """A pid that belonged to a process which has exited (and was reaped)."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


@pytest.fixture(params=sorted(SERVICES))
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    name = request.param
    request.applymarker(getattr(pytest.mark, name))
    variable, _ = SERVICES[name]
    # The Erlang distribution port is RABBITMQ_PORT + 20000; keep both in range.
    port = free_port() if name != "rabbitmq" else 5800 + os.getpid() % 500
    env = {**os.environ, "CELERY_SCHEDULER_STATE": str(tmp_path / "state"), variable: str(port)}
    yield name, env
    subprocess.run([ROOT / "scripts" / "services", "down", name], env=env, timeout=120, check=False)


def test_up_replaces_a_stale_pid_file(service: tuple[str, dict[str, str]]) -> None:
    name, env = service
    pidfile = Path(env["CELERY_SCHEDULER_STATE"]) / SERVICES[name][1]
    pidfile.parent.mkdir(parents=True)
    stale = dead_pid()
    pidfile.write_text(f"{stale}\n")

    result = subprocess.run(
        [ROOT / "scripts" / "services", "up", name],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    assert f"removing stale pid file {pidfile} ({stale})" in result.stderr
    running = int(pidfile.read_text())
    assert running != stale
    os.kill(running, 0)  # the process now in the pid file is alive
