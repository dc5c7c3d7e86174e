"""The per-thread CPU breakdown of the benchmarks' statement probe."""

from __future__ import annotations

import os

from benchmarks.threads import group_of, thread_cpu, top_groups


def test_numbered_threads_of_a_pool_are_one_group() -> None:
    assert {group_of(name) for name in ("GC Thread#0", "GC Thread#12", "CompactionExec:3",
                                        "MutationStage-7", "Native-Transpor")} == {
        "GC Thread", "CompactionExec", "MutationStage", "Native-Transpor"}
    assert group_of("42") == "42"  # a name that is only a number stays itself


def test_the_busiest_groups_come_first_in_ms_a_second() -> None:
    before = {1: ("a-1", 100), 2: ("b", 10), 3: ("a-2", 5)}
    after = {1: ("a-1", 150), 2: ("b", 10), 3: ("a-2", 10), 4: ("c", 20)}  # 4 started since
    ticks = os.sysconf("SC_CLK_TCK")
    assert top_groups(before, after, 2.0) == [("a", 55 * 1000 / ticks / 2), ("c", 20 * 1000 / ticks / 2)]


def test_a_thread_that_changed_its_name_counts_once_under_its_new_name() -> None:
    before = {7: ("ReadStage-3", 5000)}
    after = {7: ("Native-Transport-Requests-1", 5010)}  # Cassandra's shared pool renames
    ticks = os.sysconf("SC_CLK_TCK")
    assert top_groups(before, after, 1.0) == [("Native-Transport-Requests", 10 * 1000 / ticks)]


def test_a_process_shows_its_threads() -> None:
    threads = thread_cpu(os.getpid())  # this one: the interpreter has run for a while
    assert os.getpid() in threads and sum(ticks for _, ticks in threads.values()) > 0
