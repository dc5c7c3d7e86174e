"""The cluster chaos run never leaves a node down after its fault: a start that fails is
killed and tried again, and what it said is kept for the report; a fault that could not be
injected is made again at the end of its lane, so the run injects as many as it planned."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest

from tests.chaos.harness import FAULT_RETRIES, ClusterServices, Fault, Run


class Nodes(ClusterServices):
    """Cluster services whose node commands are recorded; the first *failing* ``up`` calls fail."""

    def __init__(self, tmp: Path, failing: int) -> None:
        super().__init__(tmp / "state", tmp / "services.log")
        self.failing = failing
        self.calls: list[tuple[str, str, int]] = []

    def node(self, service: str, command: str, node: int) -> None:
        self.calls.append((service, command, node))
        if command == "up" and self.failing:
            self.failing -= 1
            log = self.node_log(service, node)
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text("started\nERROR Exiting Kafka due to fatal exception\n")
            raise subprocess.CalledProcessError(1, ["kafka-cluster", "up", str(node)])


def test_a_node_that_does_not_start_is_killed_and_started_again(tmp_path: Path) -> None:
    nodes = Nodes(tmp_path, failing=1)
    failures = nodes.start_node("kafka", 2)
    assert nodes.calls == [("kafka", "up", 2), ("kafka", "kill", 2), ("kafka", "up", 2)]
    assert len(failures) == 1 and "Exiting Kafka due to fatal exception" in failures[0]


def test_a_node_that_starts_says_nothing(tmp_path: Path) -> None:
    nodes = Nodes(tmp_path, failing=0)
    assert nodes.start_node("cassandra", 3) == []
    assert nodes.calls == [("cassandra", "up", 3)]


def test_a_node_that_never_starts_is_reported_with_every_attempt(tmp_path: Path) -> None:
    nodes = Nodes(tmp_path, failing=5)
    with pytest.raises(RuntimeError, match="kafka node 1 did not start in 3 attempts") as caught:
        nodes.start_node("kafka", 1)
    assert str(caught.value).count("fatal exception") == 3
    assert [c for _, c, _ in nodes.calls] == ["up", "kill", "up", "kill", "up"]


class Lane:
    """What Run._lane uses of a run: faults of the kinds in *failing* raise that many times."""

    def __init__(self, failing: dict[str, int]) -> None:
        self._stop = threading.Event()
        self.failing = dict(failing)
        self.tried: list[str] = []
        self.faults: list[Fault] = []
        self.lane_errors: list[str] = []

    def say(self, line: str) -> None:
        pass

    def _fault(self, kind: str) -> Fault:
        self.tried.append(kind)
        if self.failing.get(kind):
            self.failing[kind] -= 1
            raise subprocess.CalledProcessError(1, ["kafka-cluster", "stop", "1"])
        return Fault(kind, "node 1", 0.0, 0.0)


def test_a_fault_that_failed_is_made_again_at_the_end_of_its_lane() -> None:
    lane = Lane({"node-stall": 1})
    Run._lane(lane, [("node-stall", 0.0), ("kafka-kill", 0.0)])  # type: ignore[arg-type]
    assert lane.tried == ["node-stall", "kafka-kill", "node-stall"]
    assert [f.kind for f in lane.faults] == ["kafka-kill", "node-stall"]
    assert len(lane.lane_errors) == 1 and "node-stall" in lane.lane_errors[0]


def test_a_fault_that_always_fails_is_given_up_after_its_retries() -> None:
    lane = Lane({"kafka-restart": 99})
    Run._lane(lane, [("kafka-restart", 0.0)])  # type: ignore[arg-type]
    assert lane.tried == ["kafka-restart"] * (1 + FAULT_RETRIES)
    assert lane.faults == [] and len(lane.lane_errors) == 1 + FAULT_RETRIES
