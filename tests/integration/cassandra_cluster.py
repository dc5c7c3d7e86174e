"""A three-node Cassandra cluster of the test's own, run by ``scripts/cassandra-cluster``:
its nodes answer CQL on 127.0.0.2-127.0.0.4, port 29042."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from tests.integration.script_cluster import ScriptCluster, running


@dataclass
class CassandraCluster(ScriptCluster):
    name = "Cassandra"
    script = "cassandra-cluster"
    state_variable = "CASSANDRA_CLUSTER_STATE"
    timeout = 600  # nodes join one at a time
    contact_points: list[str] = field(default_factory=list)  # node N is contact_points[N - 1]
    port: int = 0

    def address(self, node: int) -> str:
        return self.contact_points[node - 1]


@pytest.fixture(scope="module")
def cassandra_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CassandraCluster]:
    for cluster in running(CassandraCluster(tmp_path_factory.mktemp("cassandra-cluster"))):
        addresses = cluster.run("contact-points").stdout.strip().split(",")
        cluster.contact_points = [address.rsplit(":", 1)[0] for address in addresses]
        cluster.port = int(addresses[0].rsplit(":", 1)[1])
        yield cluster
