"""CPU per thread of a process, grouped by thread name, from ``/proc`` (Linux).

The JVM names its native threads after the Java ones (``CompactionExec``, ``Native-Transp``,
``GC Thread#0``, ...), so the groups show where Cassandra's or Kafka's CPU goes without a
profiler attached: request handling, compaction, memtable flushes, garbage collection.
Python threads have no native names before 3.14: :func:`python_thread_names` asks py-spy
(when it is installed) for the names the threads have in Python.

CPU is counted per thread and grouped by the name each thread has at the end of the window:
Cassandra's shared pool threads rename themselves after the stage they work for
(``ReadStage``, ``MutationStage``, ``Native-Transport-Requests``), so the split between those
stages is approximate, while the total of each thread is exact.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

__all__ = ["TICKS", "group_of", "python_thread_names", "thread_cpu", "thread_switches", "top_groups"]

TICKS = os.sysconf("SC_CLK_TCK")  # of the utime and stime in /proc
_NUMBERED = re.compile(r"[-_#:]?\d+$")
_DUMPED_THREAD = re.compile(r'^Thread (?:0x[0-9a-fA-F]+ )?\(?(\d+)\)?.*?"([^"]*)"', re.MULTILINE)


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
    return [(name, used * 1000 / TICKS / seconds) for name, used in grown.most_common(count)
            if used > 0]


def thread_switches(pid: int) -> dict[int, int]:
    """Per thread of *pid*: the context switches it made so far (voluntary and not).

    At a light load a thread's CPU grows with the times it is woken (each a hand-over
    between threads or a round trip to a service), more than with the work it then does.
    """
    switches: dict[int, int] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            lines = (task / "status").read_text().splitlines()
        except (FileNotFoundError, ProcessLookupError):
            continue
        # voluntary_ctxt_switches: and nonvoluntary_ctxt_switches:
        switches[int(task.name)] = sum(int(line.split()[1]) for line in lines
                                       if "ctxt_switches:" in line)
    return switches


def python_thread_names(pid: int) -> dict[int, str]:
    """The Python names of *pid*'s threads by native id, from ``py-spy dump``; empty
    without py-spy (or if it cannot attach)."""
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        return {}
    try:
        dump = subprocess.run([py_spy, "dump", "--pid", str(pid), "--nonblocking"],
                              capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return {int(tid): name for tid, name in _DUMPED_THREAD.findall(dump)}
