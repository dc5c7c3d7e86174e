"""CPU per thread of a process, grouped by thread name, from ``/proc`` (Linux).

The JVM names its native threads after the Java ones (``CompactionExec``, ``Native-Transp``,
``GC Thread#0``, ...), so the groups show where Cassandra's or Kafka's CPU goes without a
profiler attached: request handling, compaction, memtable flushes, garbage collection.
Python threads have no native names before 3.14; a Python process shows as one group.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

__all__ = ["group_of", "thread_cpu", "top_groups"]

_TICKS = os.sysconf("SC_CLK_TCK")
_NUMBERED = re.compile(r"[-_#:]?\d+$")


def group_of(name: str) -> str:
    """The pool a thread belongs to: its name without a trailing number (``GC Thread#3``)."""
    return _NUMBERED.sub("", name.strip()) or name


def thread_cpu(pid: int) -> Counter[str]:
    """CPU ticks so far of each thread group of *pid* (threads that ended are not counted)."""
    groups: Counter[str] = Counter()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text()
            # fields after the name in parentheses: state is field 3, utime 14, stime 15
            fields = (task / "stat").read_text().rpartition(")")[2].split()
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended meanwhile
        groups[group_of(name)] += int(fields[11]) + int(fields[12])
    return groups


def top_groups(before: Counter[str], after: Counter[str], seconds: float, count: int = 8
               ) -> list[tuple[str, float]]:
    """The *count* thread groups that used the most CPU between the snapshots, in ms a second."""
    grown = Counter({name: after[name] - before.get(name, 0) for name in after})
    return [(name, used * 1000 / _TICKS / seconds) for name, used in grown.most_common(count)
            if used > 0]
