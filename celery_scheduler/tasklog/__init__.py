"""The task log: where schedule and cancel records are appended, keyed by ordering id, and
every Kafka client of the package.

:class:`~celery_scheduler.tasklog.base.TaskLog` is the producer side's port and
:class:`~celery_scheduler.tasklog.base.TaskLogReader` the dispatcher's, both in the
package's own types; ``kafka`` and ``reader`` are their Kafka implementations and
``memory`` the in-process ones for unit tests and the testing helper. ``clients`` makes a
dispatcher's Kafka clients: its readers, the dead-letter producer (``dead_letters``), the
outcome reader (``outcomes``) and the producer of delayed messages (``delivery``).
"""

from celery_scheduler.tasklog.base import Position, TaskLog

__all__ = ["Position", "TaskLog"]
