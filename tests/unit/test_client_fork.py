"""A schedule call in a forked child (a prefork worker, a preloading web server) gets a
producer of its own: librdkafka's threads do not survive ``fork()``."""

from __future__ import annotations

import os

from celery_scheduler.client import SchedulerClient
from celery_scheduler.config import Settings
from celery_scheduler.tasklog.kafka import KafkaTaskLog
from celery_scheduler.tasklog.memory import MemoryTaskLog


def test_a_forked_child_opens_its_own_task_log_and_the_parent_keeps_its_own() -> None:
    parent_log = MemoryTaskLog()
    client = SchedulerClient(Settings(kafka_bootstrap_servers="127.0.0.1:1"), task_log=parent_log)
    assert client.task_log is parent_log
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it got, and leave without pytest's teardown
        try:
            log = client.task_log
            again = client.task_log
            answer = b"new" if isinstance(log, KafkaTaskLog) and again is log else b"same"
        except BaseException as exc:  # reported to the parent
            answer = repr(exc).encode()
        os.write(write, answer)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        answer = pipe.read()
    os.waitpid(pid, 0)
    assert answer == b"new"
    assert client.task_log is parent_log
