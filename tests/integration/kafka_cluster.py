"""A three-broker Kafka KRaft cluster of the test's own, run by ``scripts/kafka-cluster``.

It lives on ports 29092-29094 (controllers 29192-29194) with a state directory of its own,
so tests may kill and restart its brokers without touching the shared services. When it
cannot be started the test is skipped on a developer machine and fails when ``CI`` is set,
like the shared services in tests/services.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.services import REPO

SCRIPT = REPO / "scripts" / "kafka-cluster"
NODES = 3


@dataclass
class KafkaCluster:
    state: Path

    def run(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KAFKA_CLUSTER_STATE": str(self.state)}
        return subprocess.run([str(SCRIPT), *args], env=env, capture_output=True, text=True,
                              timeout=timeout)

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{29092 + node}" for node in range(NODES))

    def kill(self, node: int) -> None:
        result = self.run("kill", str(node))
        assert result.returncode == 0, result.stderr

    def start(self, *nodes: int) -> None:
        result = self.run("up", *map(str, nodes))
        assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    cluster = KafkaCluster(tmp_path_factory.mktemp("kafka-cluster"))
    started = cluster.run("up")
    if started.returncode != 0:
        cluster.run("kill")
        message = f"the test's Kafka cluster did not start:\n{started.stderr[-3000:]}"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    try:
        yield cluster
    finally:
        cluster.run("kill")  # its data is deleted: no need for a clean shutdown
        shutil.rmtree(cluster.state, ignore_errors=True)
