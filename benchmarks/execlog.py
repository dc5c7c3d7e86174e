"""The execution log: one line per task body started, written by the task itself.

Lateness is measured in the task (its start time minus the scheduled time it was given),
with the clock of the one machine everything runs on. Each line is one short append, which
Linux keeps whole when several worker processes write at once.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Start", "occurrence_of", "read", "read_ends", "write_end", "write_start"]


@dataclass(frozen=True)
class Start:
    ordering_id: str
    seq: int
    at: float  # scheduled time, epoch seconds
    started: float  # when the body started, epoch seconds
    pid: int
    released: float | None = None  # when the dispatcher published it (celery_scheduler only)

    @property
    def lateness(self) -> float:
        return self.started - self.at


def occurrence_of(published: float) -> float:
    """The minute an entry firing every minute fired for, from when its run was sent: at or
    after the minute (celery beat), or up to the release-ahead before it (a dispatcher), so
    the minute that starts within a second after *published* or before it."""
    return (published + 1.0) // 60 * 60


def start_line(ordering_id: str, seq: int, at: float, released: float | None = None) -> str:
    """The log line of a task starting now."""
    return (f"{ordering_id},{seq},{at!r},{time.time()!r},{os.getpid()},"
            f"{'' if released is None else repr(released)}\n")


def write_start(path: str, ordering_id: str, seq: int, at: float, released: float | None = None
                ) -> None:
    line = start_line(ordering_id, seq, at, released)
    with open(path, "a") as handle:
        handle.write(line)


def write_end(path: str, ordering_id: str, seq: int) -> None:
    """The body of a task that works (``sleep``) ended now: a line in ``<path>.ends``."""
    with open(f"{path}.ends", "a") as handle:
        handle.write(f"{ordering_id},{seq},{time.time()!r},{os.getpid()}\n")


def read_ends(path: Path) -> list[tuple[str, int, float, int]]:
    """(ordering id, seq, when, pid) of every body that ended and logged it."""
    try:
        text = Path(f"{path}.ends").read_text()
    except FileNotFoundError:
        return []
    ends = []
    for line in text.splitlines():
        parts = line.split(",")
        if len(parts) == 4:
            try:
                ends.append((parts[0], int(parts[1]), float(parts[2]), int(parts[3])))
            except ValueError:
                continue
    return ends


def read(path: Path) -> list[Start]:
    """Every start logged so far (a line still being written is skipped)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    starts = []
    for line in text.splitlines():
        parts = line.split(",")
        if len(parts) != 6:
            continue
        try:
            starts.append(Start(parts[0], int(parts[1]), float(parts[2]), float(parts[3]), int(parts[4]),
                                float(parts[5]) if parts[5] else None))
        except ValueError:
            continue
    return starts


def count(path: Path) -> int:
    """Lines written so far; cheaper than read() while waiting."""
    try:
        with path.open("rb") as handle:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: handle.read(1 << 20), b""))
    except FileNotFoundError:
        return 0
