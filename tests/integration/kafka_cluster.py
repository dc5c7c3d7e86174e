"""A Kafka KRaft cluster of the test's own, run by ``scripts/kafka-cluster``: three brokers on
ports 29092-29094 (controllers 29192-29194), or as many as asked from another port."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.integration.script_cluster import ScriptCluster, running


@dataclass
class KafkaCluster(ScriptCluster):
    name = "Kafka"
    script = "kafka-cluster"
    state_variable = "KAFKA_CLUSTER_STATE"
    timeout = 240
    nodes: int = 3
    port: int = 29092  # of broker 1; broker N listens on port + N - 1

    def environment(self) -> dict[str, str]:
        return {**super().environment(), "KAFKA_CLUSTER_NODES": str(self.nodes),
                "KAFKA_CLUSTER_PORT": str(self.port),
                "KAFKA_CLUSTER_CONTROLLER_PORT": str(self.port + 100)}

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{self.port + node}" for node in range(self.nodes))


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    yield from running(KafkaCluster(tmp_path_factory.mktemp("kafka-cluster")))


@pytest.fixture(scope="module")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """A single broker of the test's own, on 29095 (controller 29195): to stall or kill."""
    yield from running(KafkaCluster(tmp_path_factory.mktemp("kafka-broker"), nodes=1,
                                    port=29095))
