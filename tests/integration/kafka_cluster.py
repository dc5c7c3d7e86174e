"""A three-broker Kafka KRaft cluster of the test's own, run by ``scripts/kafka-cluster``, on
ports 29092-29094 (controllers 29192-29194)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.integration.script_cluster import ScriptCluster, running

NODES = 3


@dataclass
class KafkaCluster(ScriptCluster):
    name = "Kafka"
    script = "kafka-cluster"
    state_variable = "KAFKA_CLUSTER_STATE"
    timeout = 240

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{29092 + node}" for node in range(NODES))


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    yield from running(KafkaCluster(tmp_path_factory.mktemp("kafka-cluster")))
