"""Log lines a log pipeline can read: one JSON object a line, with the task's fields.

``celery -A proj scheduler dispatch --log-format json`` writes every line as JSON with the
time, level, logger and message, and, on every line about a task, its ``task_key``,
``ordering_id``, ``task_id`` and ``partition``, so a log search finds one task's history
across dispatchers. The task is the first task key among the line's arguments.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable

from celery_scheduler.keys import TaskKey
from celery_scheduler.partitioner import partition_for

__all__ = ["JsonFormatter"]


class JsonFormatter(logging.Formatter):
    """Formats records as JSON; *partitions* gives the topic's partition count, if known."""

    def __init__(self, partitions: Callable[[], int | None] | None = None) -> None:
        super().__init__()
        self._partitions = partitions or (lambda: None)

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.timezone.utc).isoformat(
                timespec="milliseconds"),
            "level": record.levelname, "logger": record.name, "message": record.getMessage(),
            "process": record.process, "thread": record.threadName,
        }
        args = record.args if isinstance(record.args, tuple) else ()
        key = next((arg for arg in args if isinstance(arg, TaskKey)), None)
        if key is not None:
            line.update(task_key=str(key), ordering_id=key.ordering_id, task_id=key.task_id)
            count = self._partitions()
            if count:
                line["partition"] = partition_for(key.ordering_id, count)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)
