"""The dispatcher's JSON log lines carry the task's fields."""

from __future__ import annotations

import json
import logging

from celery_scheduler.keys import TaskKey
from celery_scheduler.logs import JsonFormatter
from celery_scheduler.partitioner import partition_for


def _line(formatter: JsonFormatter, message: str, *args: object) -> dict[str, object]:
    record = logging.LogRecord("celery_scheduler.dispatcher.engine", logging.WARNING, __file__, 1,
                               message, args, None)
    parsed: dict[str, object] = json.loads(formatter.format(record))
    return parsed


def test_a_line_about_a_task_carries_its_key_ordering_id_task_id_and_partition() -> None:
    key = TaskKey("customer-42", 1_893_456_000_000, "welcome")
    line = _line(JsonFormatter(lambda: 12), "no outcome for %s within its lease; releasing it again", key)
    assert line["message"] == f"no outcome for {key} within its lease; releasing it again"
    assert (line["level"], line["logger"]) == ("WARNING", "celery_scheduler.dispatcher.engine")
    assert (line["task_key"], line["ordering_id"], line["task_id"]) == (str(key), "customer-42",
                                                                       key.task_id)
    assert line["partition"] == partition_for("customer-42", 12)


def test_other_lines_have_no_task_fields_and_no_partition_before_the_count_is_known() -> None:
    assert "task_key" not in _line(JsonFormatter(), "leased partition %d (epoch %d)", 3, 7)
    key = TaskKey("a", 0, "u")
    line = _line(JsonFormatter(lambda: None), "cancelled %s", key)
    assert line["ordering_id"] == "a" and "partition" not in line
