"""The per-thread CPU breakdown of the benchmarks' statement probe."""

from __future__ import annotations

import os
from collections import Counter

from benchmarks.threads import group_of, thread_cpu, top_groups


def test_numbered_threads_of_a_pool_are_one_group() -> None:
    assert {group_of(name) for name in ("GC Thread#0", "GC Thread#12", "CompactionExec:3",
                                        "MutationStage-7", "Native-Transpor")} == {
        "GC Thread", "CompactionExec", "MutationStage", "Native-Transpor"}
    assert group_of("42") == "42"  # a name that is only a number stays itself


def test_the_busiest_groups_come_first_in_ms_a_second() -> None:
    before = Counter({"a": 100, "b": 10})
    after = Counter({"a": 150, "b": 10, "c": 20})
    ticks = os.sysconf("SC_CLK_TCK")
    assert top_groups(before, after, 2.0) == [("a", 50 * 1000 / ticks / 2), ("c", 20 * 1000 / ticks / 2)]


def test_a_process_shows_its_threads() -> None:
    groups = thread_cpu(os.getpid())  # this one: the interpreter has run for a while
    assert sum(groups.values()) > 0 and all(isinstance(ticks, int) for ticks in groups.values())
