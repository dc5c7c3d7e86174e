"""CPU per thread of a process, grouped by thread name, from ``/proc`` (Linux).

The JVM names its native threads after the Java ones (``CompactionExec``, ``Native-Transp``,
``GC Thread#0``, ...), so the groups show where Cassandra's or Kafka's CPU goes without a
profiler attached: request handling, compaction, memtable flushes, garbage collection.
Python threads have no native names before 3.14; a Python process shows as one group.

CPU is counted per thread and grouped by the name each thread has at the end of the window:
Cassandra's shared pool threads rename themselves after the stage they work for
(``ReadStage``, ``MutationStage``, ``Native-Transport-Requests``), so the split between those
stages is approximate, while the total of each thread is exact.
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


def thread_cpu(pid: int) -> dict[int, tuple[str, int]]:
    """Per thread of *pid*: its name and its CPU ticks so far (threads that ended are gone)."""
    threads: dict[int, tuple[str, int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text()
            # fields after the name in parentheses: state is field 3, utime 14, stime 15
            fields = (task / "stat").read_text().rpartition(")")[2].split()
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended meanwhile
        threads[int(task.name)] = (name.strip(), int(fields[11]) + int(fields[12]))
    return threads


def top_groups(before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]],
               seconds: float, count: int = 8) -> list[tuple[str, float]]:
    """The *count* thread groups that used the most CPU between the snapshots, in ms a second.

    A thread started in between counts from zero; one that ended in between is not counted.
    """
    grown: Counter[str] = Counter()
    for tid, (name, ticks) in after.items():
        grown[group_of(name)] += ticks - before.get(tid, ("", 0))[1]
    return [(name, used * 1000 / _TICKS / seconds) for name, used in grown.most_common(count)
            if used > 0]
