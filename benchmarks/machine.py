"""What the figures were measured on: the machine is shared, so its load is part of the record."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

__all__ = ["describe", "load_average", "speed_probe"]

# Tries of the speed probe's workload; the fastest counts (the others met an interruption).
PROBE_TRIES = 7


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    return float("nan")


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f}"


def describe() -> dict[str, str]:
    """Cores, memory, CPU model, OS and Python, as label → text."""
    return {
        "CPU": f"{_cpu_model()}, {os.cpu_count()} logical cores",
        "memory": f"{_memory_gib():.1f} GiB",
        "system": f"{platform.system()} {platform.release()}, Python {platform.python_version()}",
    }


def _probe_workload() -> None:
    """A fixed mix of what the scheduler's processes do: build dicts, encode, decode, sort."""
    rows = [{"ordering_id": f"o{i % 97}", "seq": i, "at": i * 0.5, "tags": [i, str(i)]}
            for i in range(3000)]
    text = json.dumps(rows, sort_keys=True)
    decoded = json.loads(text)
    decoded.sort(key=lambda row: (row["ordering_id"], -row["seq"]))


def speed_probe() -> float:
    """CPU milliseconds the probe's workload takes on this thread, the fastest of PROBE_TRIES.

    The machine's speed moves between hours (a shared host): the same workload measured
    before each scenario says how fast the machine was for it, so runs made at different
    times can be compared. CPU time, not wall time: a core taken away meanwhile does not
    count, a slower core does.
    """
    best = float("inf")
    for _ in range(PROBE_TRIES):
        began = time.thread_time_ns()
        _probe_workload()
        best = min(best, (time.thread_time_ns() - began) / 1e6)
    return best
