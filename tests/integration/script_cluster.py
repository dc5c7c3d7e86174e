"""A cluster of a test's own, run by one of the project's cluster scripts
(``scripts/kafka-cluster``, ``scripts/cassandra-cluster``).

Each lives on ports of its own with a state directory of its own, so tests may kill, stall
and restart its nodes without touching the shared services. When it cannot be started the
test is skipped on a developer machine and fails when ``CI`` is set, like the shared
services in tests/services.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, TypeVar

import pytest

from tests.services import REPO


@dataclass
class ScriptCluster:
    state: Path
    name: ClassVar[str]  # of the service, in messages
    script: ClassVar[str]  # in scripts/
    state_variable: ClassVar[str]  # the script's environment variable for its state
    timeout: ClassVar[float]  # seconds a command of the script may take

    def environment(self) -> dict[str, str]:
        """What the script is told of this cluster."""
        return {self.state_variable: str(self.state)}

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, **self.environment()}
        return subprocess.run([str(REPO / "scripts" / self.script), *args], env=env,
                              capture_output=True, text=True, timeout=self.timeout)

    def stop(self, node: int) -> None:
        """SIGSTOP *node*: a stalled node, its connections open and silent."""
        result = self.run("stop", str(node))
        assert result.returncode == 0, result.stderr

    def cont(self, node: int) -> None:
        result = self.run("cont", str(node))
        assert result.returncode == 0, result.stderr

    def kill(self, node: int) -> None:
        """SIGKILL *node*: nothing flushed, as a crash."""
        result = self.run("kill", str(node))
        assert result.returncode == 0, result.stderr

    def start(self, *nodes: int) -> None:
        result = self.run("up", *map(str, nodes))
        assert result.returncode == 0, result.stderr[-3000:]


Cluster = TypeVar("Cluster", bound=ScriptCluster)


def running(cluster: Cluster) -> Iterator[Cluster]:
    """Start every node of *cluster*, yield it, then kill it and delete its data (no need
    for a clean shutdown)."""
    started = cluster.run("up")
    if started.returncode != 0:
        cluster.run("kill")
        message = f"the test's {cluster.name} cluster did not start:\n{started.stderr[-3000:]}"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    try:
        yield cluster
    finally:
        cluster.run("kill")
        shutil.rmtree(cluster.state, ignore_errors=True)
