"""The small records that cross between processes beside the schedule envelope.

- the **release header** (``celery_scheduler``) a dispatcher puts on every task it releases:
  which key and attempt the message belongs to, from which partition, under which lease
  epoch, and until when it may start;
- the **outcome** a worker produces to ``<topic>.outcomes`` when an attempt ended.

Both carry the task key in the same compact form (``o`` ordering id, ``t`` scheduled time in
epoch milliseconds, ``u`` uniqueness key). Fields added later are optional, so a dispatcher
reads what workers of an earlier version write and the other way round. The schedule call
itself travels as an envelope (:mod:`celery_scheduler.envelope`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from celery_scheduler.keys import TaskKey

__all__ = ["HEADER", "Outcome", "Release", "outcome_topic", "parse_header"]

# Message header naming the task key and attempt of a released task.
HEADER = "celery_scheduler"


def _key_fields(key: TaskKey) -> dict[str, Any]:
    return {"o": key.ordering_id, "t": key.scheduled_ms, "u": key.uniqueness_key}


def _key_of(data: dict[str, Any]) -> TaskKey:
    return TaskKey(str(data["o"]), int(data["t"]), str(data["u"]))


def _dumps(document: dict[str, Any]) -> str:
    # compact, non-ASCII as is: json.dumps(ensure_ascii=False, separators=(",", ":")), in C
    return orjson.dumps(document).decode("utf-8")


@dataclass(frozen=True)
class Release:
    """What the worker needs: which key and attempt, whose partition, and when it may start.

    ``lease_until_ms`` is the end of the attempt's lease: the dispatcher releases the key
    again then if no outcome came, so a copy of this message that a worker gets later (one
    the broker gave back long after) is stale without asking anyone. ``not_before_ms`` is
    the time the attempt was due: a release sent ahead of it carries it as Celery's ``eta``
    too, and the worker holds the task until then. Both are 0 in headers written before
    they were carried.
    """

    key: TaskKey
    partition: int
    attempt: int
    epoch: int
    lease_until_ms: int = 0
    not_before_ms: int = 0

    def header(self) -> str:
        return _dumps({**_key_fields(self.key), "p": self.partition, "a": self.attempt,
                       "e": self.epoch, "l": self.lease_until_ms, "d": self.not_before_ms})


def parse_header(value: object) -> Release | None:
    """Read a ``celery_scheduler`` header; None if absent or not ours."""
    if not isinstance(value, str):
        return None
    try:
        data = orjson.loads(value)
        return Release(_key_of(data), int(data["p"]), int(data["a"]), int(data["e"]),
                       int(data.get("l", 0)), int(data.get("d", 0)))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


@dataclass(frozen=True)
class Outcome:
    """One attempt's result, as a dispatcher receives it."""

    key: TaskKey
    partition: int
    attempt: int
    succeeded: bool
    error: str | None
    started_ms: int = 0  # when the attempt's body started on the worker (0: not reported)
    finished_ms: int = 0  # when it returned or raised

    def encode(self) -> bytes:
        return _dumps({**_key_fields(self.key), "p": self.partition, "a": self.attempt,
                       "s": self.succeeded, "x": self.error, "b": self.started_ms,
                       "f": self.finished_ms}).encode("utf-8")

    @classmethod
    def decode(cls, data: str | bytes) -> Outcome | None:
        try:
            d = orjson.loads(data)
            # "b" and "f" are missing from workers of earlier versions
            return cls(_key_of(d), int(d["p"]), int(d["a"]), bool(d["s"]),
                       d["x"] if isinstance(d["x"], str) else None,
                       int(d.get("b") or 0), int(d.get("f") or 0))
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


def outcome_topic(topic: str) -> str:
    """Where workers report outcomes: one partition for each partition of *topic*."""
    return f"{topic}.outcomes"
