"""What the services hold for the scheduler's pending tasks: Cassandra's bytes on disk and
its memory, and Kafka's log bytes, read from the local services that ``scripts/services``
runs (their jars, state directory and JMX port).

A scheduler that keeps its tasks in a database is not free of memory because its own process
is small: the memory row of BENCHMARKS.md adds what Cassandra and Kafka keep for them.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
from pathlib import Path

__all__ = ["cassandra_flush", "cassandra_info", "kafka_log_bytes", "keyspace_disk_bytes",
           "state_dir"]

CASSANDRA_VERSION = os.environ.get("CASSANDRA_VERSION", "5.0.9")
CASSANDRA_JMX_PORT = os.environ.get("CASSANDRA_JMX_PORT", "7199")


def state_dir() -> Path:
    """Where ``scripts/services`` keeps the services' data (its CELERY_SCHEDULER_STATE)."""
    default = Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state"))
    return Path(os.environ.get("CELERY_SCHEDULER_STATE", default / "celery-scheduler"))


def _cache_dir() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return Path(os.environ.get("CELERY_SCHEDULER_CACHE", default / "celery-scheduler"))


def nodetool(*args: str) -> str:
    """Cassandra's nodetool, run from the node's own jars over its local JMX port."""
    lib = _cache_dir() / f"cassandra-{CASSANDRA_VERSION}" / "lib"
    if not lib.is_dir():
        raise FileNotFoundError(f"no Cassandra jars in {lib}: run scripts/services up first")
    result = subprocess.run(
        ["java", "--add-exports", "java.base/sun.nio.ch=ALL-UNNAMED", "--add-exports",
         "java.base/jdk.internal.ref=ALL-UNNAMED", "-cp", f"{lib}/*",
         "org.apache.cassandra.tools.NodeTool", "-p", CASSANDRA_JMX_PORT, *args],
        capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise RuntimeError(f"nodetool {' '.join(args)} failed: {result.stderr[-1000:]}")
    return result.stdout


def cassandra_flush(keyspace: str) -> None:
    """Write the keyspace's memtables to disk, so its bytes on disk are all of its data."""
    nodetool("flush", keyspace)


def cassandra_info() -> dict[str, float]:
    """The node's heap in use and its off-heap memory, MB (``nodetool info``)."""
    text = nodetool("info")
    heap = re.search(r"Heap Memory \(MB\)\s*:\s*([\d.]+)\s*/", text)
    off_heap = re.search(r"Off Heap Memory \(MB\)\s*:\s*([\d.]+)", text)
    if heap is None or off_heap is None:
        raise RuntimeError(f"nodetool info said no heap figures: {text[-500:]}")
    return {"heap_mb": float(heap.group(1)), "off_heap_mb": float(off_heap.group(1))}


def _bytes_under(pattern: str) -> int:
    return sum(os.path.getsize(path) for path in glob.glob(pattern, recursive=True)
               if os.path.isfile(path))


def keyspace_disk_bytes(keyspace: str) -> int:
    """Bytes of the keyspace's SSTables on the node's disk (after a flush, all of its data)."""
    return _bytes_under(str(state_dir() / "cassandra" / "data" / "data" / keyspace / "**"))


def kafka_log_bytes(topic: str) -> int:
    """Bytes of the topic's log segments on the broker's disk (one replica)."""
    return _bytes_under(str(state_dir() / "kafka" / "data" / f"{topic}-*" / "*.log"))
