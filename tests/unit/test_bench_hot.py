"""Scenario 3h's pure parts: the hot id's tasks in order, and the Cassandra rows it shows."""

from __future__ import annotations

from benchmarks.hot import _hot_order, _statement_rows
from benchmarks.report import Section


def test_the_hot_ids_tasks_must_start_in_their_order() -> None:
    assert _hot_order([1, 2, 5])
    assert not _hot_order([1, 5, 2])


def test_only_the_tables_a_hot_id_moved_get_rows_beside_the_requests() -> None:
    section = Section("3h", "hot")
    alone = [{"requests": 400.0, "writes of tasks": 100.0, "reads of status": 50.0}] * 2
    beside = [{"requests": 900.0, "writes of tasks": 420.0, "reads of status": 53.0,
               "scans of tasks": 12.0}] * 2
    _statement_rows(section, {"no hot id": alone, "with it": beside})
    labels = [row.what for row in section.rows]
    assert labels == [
        "Cassandra requests a second, no hot id", "Cassandra requests a second, with it",
        "Cassandra scans of tasks a second, no hot id", "Cassandra scans of tasks a second, with it",
        "Cassandra writes of tasks a second, no hot id", "Cassandra writes of tasks a second, with it"]
    assert section.rows[-1].figure.median == 420.0
    assert section.rows[2].figure.median == 0.0  # no scans without it: counted as none
