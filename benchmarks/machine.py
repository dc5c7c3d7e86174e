"""What the figures were measured on: the machine is shared, so its load is part of the record."""

from __future__ import annotations

import os
import platform
from pathlib import Path

__all__ = ["describe", "load_average"]


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
