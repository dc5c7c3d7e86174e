"""The worker side: run only current releases, report each one's outcome; the dispatcher's inbox.

Before a released task runs, the worker checks that the message is the key's current
release: a copy of an older attempt (a message a killed worker had prefetched, given back by
the broker after its visibility timeout, long after the dispatcher released the key again)
or of a key that already finished is skipped, so it can neither run a completed key again
nor overlap the current attempt. When the store cannot be read the task runs: at least once.

The hooks are Celery signal handlers (``task_success``, ``task_failure``) connected when a
task is decorated with ``@scheduled_task``, so any worker that imports the task reports
without further set-up. A report is written to the store first (the source of truth, which
the dispatcher also polls) and then published on Redis, so the owning dispatcher can
release the next task of the ordering id within milliseconds.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery import signals
from celery.exceptions import Ignore

from celery_scheduler.bridge import HEADER, parse_header
from celery_scheduler.client import get_client, now_ms
from celery_scheduler.config import Settings
from celery_scheduler.errors import SchedulerError
from celery_scheduler.keys import TaskKey
from celery_scheduler.store.base import State

__all__ = ["Outcome", "guard_stale_releases", "install_worker_hooks", "is_current_release",
           "notice_channel", "redis_url", "subscribe"]

logger = logging.getLogger(__name__)

MAX_ERROR_LENGTH = 2000
_installed = threading.Lock()
_hooks_connected = False


@dataclass(frozen=True)
class Outcome:
    """One attempt's result, as a dispatcher receives it."""

    key: TaskKey
    partition: int
    attempt: int
    succeeded: bool
    error: str | None

    def encode(self) -> str:
        key = self.key
        return json.dumps({"o": key.ordering_id, "t": key.scheduled_ms, "u": key.uniqueness_key,
                           "p": self.partition, "a": self.attempt, "s": self.succeeded,
                           "x": self.error}, ensure_ascii=False)

    @classmethod
    def decode(cls, data: str | bytes) -> Outcome | None:
        try:
            d = json.loads(data)
            return cls(TaskKey(str(d["o"]), int(d["t"]), str(d["u"])), int(d["p"]), int(d["a"]),
                       bool(d["s"]), d["x"] if isinstance(d["x"], str) else None)
        except (ValueError, KeyError, TypeError):
            return None


def notice_channel(settings: Settings) -> str:
    """The Redis channel completion notices of one scheduler topic travel on."""
    return f"celery_scheduler:{settings.kafka_topic}:outcomes"


def redis_url(app: Any, settings: Settings) -> str | None:
    """Where notices go: ``scheduler_redis_url``, else the broker if it is Redis."""
    if settings.redis_url:
        return settings.redis_url
    broker = app.conf.broker_url or ""
    return broker if isinstance(broker, str) and broker.startswith(("redis://", "rediss://")) else None


_publishers: dict[str, Any] = {}


def _publish(url: str, channel: str, message: str) -> None:
    import redis

    client = _publishers.get(url)
    if client is None:
        client = _publishers[url] = redis.Redis.from_url(url, socket_timeout=5)
    client.publish(channel, message)


def report(task: Any, succeeded: bool, error: str | None) -> None:
    """Record the outcome of *task*'s current execution if it was released by a dispatcher."""
    release = parse_header(getattr(task.request, HEADER, None))
    if release is None:
        return
    app = task._get_app()
    client = get_client(app)
    outcome = Outcome(release.key, release.partition, release.attempt, succeeded,
                      None if error is None else error[:MAX_ERROR_LENGTH])
    try:
        client.store.record_outcome(outcome.key, outcome.attempt, succeeded, outcome.error, now_ms())
    except SchedulerError:
        # The dispatcher re-releases the task when its lease ends: at least once, not lost.
        logger.exception("could not record the outcome of %s; it will run again after its lease",
                         outcome.key)
        return
    url = redis_url(app, client.settings)
    if url is None:
        return
    try:
        _publish(url, notice_channel(client.settings), outcome.encode())
    except Exception:  # the dispatcher polls the store as well; a lost notice only costs time
        logger.warning("could not publish the outcome of %s on Redis", outcome.key, exc_info=True)


def is_current_release(task: Any) -> bool:
    """Whether *task*'s execution may run: not a release, or the key's current release."""
    release = parse_header(getattr(task.request, HEADER, None))
    if release is None:
        return True
    try:
        status = get_client(task._get_app()).store.status(release.key)
    except SchedulerError:
        logger.warning("could not check that %s (attempt %d) is current; running it",
                       release.key, release.attempt, exc_info=True)
        return True
    if status is None:  # unknown to the store (status expired): at least once
        return True
    current = (status.state is State.RELEASED and status.attempts == release.attempt
               and not (status.outcome and status.outcome_attempt >= release.attempt))
    if not current:
        logger.warning("skipping a stale copy of %s (attempt %d): the key is %s at attempt %d",
                       release.key, release.attempt, status.state.value, status.attempts)
    return current


def guard_stale_releases(task: Any) -> None:
    """Make *task* skip (Celery's ``Ignore``) executions that are not its key's current release."""
    run = task.run

    @functools.wraps(run)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if not is_current_release(task):
            raise Ignore()
        return run(*args, **kwargs)

    task.run = guarded


def _on_success(sender: Any = None, **_: Any) -> None:
    if sender is not None:
        report(sender, True, None)


def _on_failure(sender: Any = None, exception: BaseException | None = None, **_: Any) -> None:
    if sender is not None:
        report(sender, False, f"{type(exception).__name__}: {exception}" if exception else "failed")


def install_worker_hooks() -> None:
    """Connect the outcome reporters to Celery's signals (once per process)."""
    global _hooks_connected
    with _installed:
        if _hooks_connected:
            return
        signals.task_success.connect(_on_success, weak=False, dispatch_uid="celery_scheduler.success")
        signals.task_failure.connect(_on_failure, weak=False, dispatch_uid="celery_scheduler.failure")
        _hooks_connected = True


def subscribe(url: str, channel: str, deliver: Callable[[Outcome], None],
              stopped: threading.Event) -> threading.Thread:
    """Deliver every notice on *channel* to *deliver*, reconnecting, until *stopped* is set."""
    import redis

    def listen() -> None:
        delay = 0.1
        while not stopped.is_set():
            try:
                client = redis.Redis.from_url(url, socket_timeout=None, health_check_interval=10)
                pubsub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
                pubsub.subscribe(channel)
                delay = 0.1
                while not stopped.is_set():
                    message = pubsub.get_message(timeout=0.5)
                    if message is not None and message.get("type") == "message":
                        outcome = Outcome.decode(message["data"])
                        if outcome is not None:
                            deliver(outcome)
                pubsub.close()
                client.close()
            except redis.RedisError:
                logger.warning("completion notices: Redis unavailable, retrying in %.1fs", delay)
                stopped.wait(delay)
                delay = min(delay * 2, 5.0)

    thread = threading.Thread(target=listen, name="celery-scheduler-notices", daemon=True)
    thread.start()
    return thread


__all__ += ["report"]
