"""Where the CPU goes: CPU time per task of each part of the pipeline, and how busy the machine was.

On a small machine with every service co-located, a throughput figure alone does not say
what limits it. A :class:`CpuMeter` samples the CPU time (user + system) of the scenario's
processes and of the services' processes over the measured window, and the machine's busy
share; divided by the tasks handled, it names the limiting resource: when the machine is
near 100% busy, CPU is the limit and the per-part figures show who spends it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass

import psutil

from benchmarks.report import Row, Section
from benchmarks.stats import Figure

__all__ = ["COST_TARGETS", "CpuMeter", "CpuUse", "add_cost_targets", "add_rows", "local_services",
           "service_pids"]

# How each local service's process is recognised (scripts/services starts them).
SERVICES = {
    "Cassandra": "org.apache.cassandra.service.CassandraDaemon",
    "Kafka": "kafka.Kafka",
    "Redis": "redis-server",
    "PostgreSQL": "bin/postgres",  # the postmaster; its backends are its children
    "RabbitMQ": "rabbit",  # the Erlang VM running it
}


def service_pids(ports: dict[str, int]) -> dict[str, list[int]]:
    """The pids of the local services listening on *ports* (name -> port)."""
    listening: dict[int, int] = {}
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.pid:
            listening.setdefault(conn.laddr.port, conn.pid)
    found: dict[str, list[int]] = {}
    for name, port in ports.items():
        pid = listening.get(port)
        if pid is not None and SERVICES[name] in " ".join(psutil.Process(pid).cmdline()):
            found[name] = [pid]
    return found


def local_services() -> dict[str, list[int]]:
    """The pids of the Kafka, Cassandra, Redis and (when it runs) PostgreSQL the benchmarks use."""
    from urllib.parse import urlparse

    from benchmarks.harness import KAFKA, POSTGRES, RABBITMQ_URL, REDIS_URL

    return service_pids({"Kafka": int(KAFKA.rpartition(":")[2]), "Cassandra": 9042,
                         "Redis": urlparse(REDIS_URL).port or 6379,
                         "PostgreSQL": urlparse(POSTGRES).port or 5432,
                         "RabbitMQ": urlparse(RABBITMQ_URL).port or 5672})


def _cpu_seconds(pids: Iterable[int], children: bool = True) -> float:
    """CPU seconds of *pids*, with (*children*) those of their descendants, live or gone.

    A descendant that exits and is waited for leaves the tree, and its CPU time moves into
    its parent's ``children_*`` times: counting those keeps the total from falling when a
    service's helper process ends inside the window (it read a negative CPU for RabbitMQ).
    """
    total = 0.0
    for pid in pids:
        try:
            process = psutil.Process(pid)
            tree = [process, *(process.children(recursive=True) if children else [])]
        except psutil.NoSuchProcess:
            continue
        for p in tree:
            try:
                times = p.cpu_times()
            except psutil.NoSuchProcess:  # ended since the tree was listed (or a zombie)
                continue
            total += times.user + times.system
            if children:
                total += times.children_user + times.children_system
    return total


def _machine_busy() -> tuple[float, float]:
    times = psutil.cpu_times()
    idle = times.idle + getattr(times, "iowait", 0.0)
    return sum(times) - idle, sum(times)


@dataclass(frozen=True)
class CpuUse:
    """CPU seconds per part over a window, the window's length and the machine's busy share."""

    seconds: dict[str, float]
    wall: float
    busy: float  # 0..1 of all cores

    def ms_per_task(self, tasks: int) -> dict[str, float]:
        """CPU ms per task of each part; not a number when no task ran (a system that missed
        every deadline still gets its rows)."""
        return {part: 1000 * s / tasks if tasks else math.nan for part, s in self.seconds.items()}


class CpuMeter:
    """``meter = CpuMeter(parts); meter.start(); ...; use = meter.stop()``.

    *parts* maps a name to the pids it covers (their children are counted too, except for
    the parts named in *alone*: the measuring process itself, whose children are the other
    parts). A process that exits inside the window is counted up to its last sample only:
    keep the window to the steady state.
    """

    def __init__(self, parts: dict[str, list[int]], alone: Iterable[str] = ()) -> None:
        self.parts = parts
        self.alone = set(alone)
        self._start: dict[str, float] = {}
        self._busy: tuple[float, float] = (0.0, 0.0)
        self._wall = 0.0

    def start(self) -> None:
        self._start = {part: self._seconds(part) for part in self.parts}
        self._busy = _machine_busy()
        self._wall = time.monotonic()

    def _seconds(self, part: str) -> float:
        return _cpu_seconds(self.parts[part], children=part not in self.alone)

    def stop(self) -> CpuUse:
        seconds = {part: self._seconds(part) - self._start[part] for part in self.parts}
        busy, total = _machine_busy()
        share = (busy - self._busy[0]) / (total - self._busy[1]) if total > self._busy[1] else 0.0
        return CpuUse(seconds, time.monotonic() - self._wall, share)


def add_rows(section: Section, label: str, uses: list[CpuUse], tasks: list[int]) -> dict[str, Row]:
    """Rows: the machine's busy share, then CPU ms per task of each part and in all; returns
    the per-part rows by part, for the caller to set targets on."""
    cores = psutil.cpu_count() or 1
    section.add(f"{label}: machine CPU busy (all {cores} cores)",
                Figure.of([u.busy for u in uses], "%", 0))
    parts = list(uses[0].seconds) if uses else []
    rows = {}
    for part in parts:
        rows[part] = section.add(
            f"{label}: CPU per task, {part}",
            Figure.of([u.ms_per_task(n)[part] for u, n in zip(uses, tasks, strict=True)], "ms", 2))
    section.add(f"{label}: CPU per task, all parts",
                Figure.of([sum(u.ms_per_task(n).values()) for u, n in zip(uses, tasks, strict=True)],
                          "ms", 2))
    return rows


# What a scheduled task may cost, in ms of CPU per task (3b and 6): the dispatcher's and
# Cassandra's own, and the workers' beyond what plain Celery's workers spend in the same run.
COST_TARGETS = {"dispatcher": 1.0, "Cassandra": 1.5}
WORKER_OVERHEAD_TARGET = 0.5


def add_cost_targets(section: Section, rows: dict[str, Row], ours: list[tuple[CpuUse, int]],
                     peer: list[tuple[CpuUse, int]], peer_label: str) -> None:
    """Marks our per-part rows against COST_TARGETS and adds the workers' CPU per task beyond
    the peer's (plain Celery on the same load), run by run."""
    for part, limit in COST_TARGETS.items():
        row = rows.get(part)
        if row is not None:
            row.target, row.met = f"≤ {limit:g} ms", row.figure.median <= limit
    extra = Figure.of([use.ms_per_task(n).get("workers", math.nan) - p.ms_per_task(m).get("workers", math.nan)
                       for (use, n), (p, m) in zip(ours, peer, strict=False)], "ms", 2)
    section.add(f"celery_scheduler: CPU per task, workers, minus {peer_label}'s in the same run", extra,
                f"≤ +{WORKER_OVERHEAD_TARGET:g} ms", extra.median <= WORKER_OVERHEAD_TARGET)
