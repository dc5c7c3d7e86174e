"""The small records that cross between processes beside the schedule envelope.

- the **release header** (``celery_scheduler``) a dispatcher puts on every task it releases:
  which key and attempt the message belongs to, from which partition, under which lease
  epoch, until when it may start, and how long its worker may go unheard while it runs;
- the **outcome** a worker produces to ``<topic>.outcomes`` when an attempt ended;
- the **beat** a worker produces there while an attempt runs: that it started, then that
  it is still running (see :mod:`celery_scheduler.heartbeat` for the rules both sides keep).

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
from celery_scheduler.tasklog.topics import outcome_topic

__all__ = ["HEADER", "Beat", "Outcome", "OutcomeBatch", "Release", "decode_report", "outcome_topic",
           "parse_header"]

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

    ``lease_until_ms`` is the end of the attempt's start lease: a copy of this message that
    a worker gets later (one the broker gave back long after, or one of a release sent
    again because it had not started) is stale without asking anyone. It also tells this
    release apart from another of the same attempt, sent again because it had not started:
    beats and outcomes carry it. ``not_before_ms`` is the time the attempt was due: a release
    sent ahead of it carries it as Celery's ``eta`` too, and the worker holds the task until
    then. ``run_lease_ms`` is how long the worker may go unheard while it runs the task before
    the dispatcher releases it again (0: the dispatcher expects no beats). ``marked_ms`` is
    when the dispatcher marked the release in the store. Fields missing from headers written
    before they were carried read as 0.
    """

    key: TaskKey
    partition: int
    attempt: int
    epoch: int
    lease_until_ms: int = 0
    not_before_ms: int = 0
    run_lease_ms: int = 0
    marked_ms: int = 0

    def header(self) -> str:
        return _dumps({**_key_fields(self.key), "p": self.partition, "a": self.attempt,
                       "e": self.epoch, "l": self.lease_until_ms, "d": self.not_before_ms,
                       "r": self.run_lease_ms, "m": self.marked_ms})


def parse_header(value: object) -> Release | None:
    """Read a ``celery_scheduler`` header; None if absent or not ours."""
    if not isinstance(value, str):
        return None
    try:
        data = orjson.loads(value)
        return Release(_key_of(data), int(data["p"]), int(data["a"]), int(data["e"]),
                       int(data.get("l", 0)), int(data.get("d", 0)), int(data.get("r", 0)),
                       int(data.get("m", 0)))
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
    generation: int = 0  # the release's lease_until_ms (0: a worker that does not say)

    def encode(self) -> bytes:
        return _dumps({**_key_fields(self.key), "p": self.partition, "a": self.attempt,
                       "s": self.succeeded, "x": self.error, "b": self.started_ms,
                       "f": self.finished_ms, "g": self.generation}).encode("utf-8")

    @classmethod
    def decode(cls, data: str | bytes) -> Outcome | None:
        report = decode_report(data)
        return report if isinstance(report, Outcome) else None


@dataclass(frozen=True)
class Beat:
    """A worker's word that an attempt is running: ``started`` on the first, then every few
    seconds while it runs (``sent_ms``: the worker's clock when it sent it)."""

    key: TaskKey
    partition: int
    attempt: int
    generation: int  # the release's lease_until_ms
    sent_ms: int
    started_ms: int
    run_lease_ms: int  # the release's, which the worker keeps
    offset: int = -1  # where the dispatcher read it (not encoded)

    def encode(self) -> bytes:
        # "k" marks a beat: a dispatcher that knows only outcomes finds no "s" and skips it
        return _dumps({**_key_fields(self.key), "k": "beat", "p": self.partition,
                       "a": self.attempt, "g": self.generation, "w": self.sent_ms,
                       "b": self.started_ms, "r": self.run_lease_ms}).encode("utf-8")


def decode_report(data: str | bytes) -> Outcome | Beat | None:
    """Read a record of the outcomes topic: an outcome, a beat, or None if it is neither."""
    try:
        d = orjson.loads(data)
        if d.get("k") == "beat":
            return Beat(_key_of(d), int(d["p"]), int(d["a"]), int(d["g"]), int(d["w"]),
                        int(d.get("b") or 0), int(d["r"]))
        # "b", "f" and "g" are missing from workers of earlier versions
        return Outcome(_key_of(d), int(d["p"]), int(d["a"]), bool(d["s"]),
                       d["x"] if isinstance(d["x"], str) else None,
                       int(d.get("b") or 0), int(d.get("f") or 0), int(d.get("g") or 0))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


class OutcomeBatch:
    """Outcomes and beats read together, and the offsets to commit once their effect is
    stored; *retried*: outcomes whose effect an earlier write did not store, applied again."""

    __slots__ = ("beats", "offsets", "outcomes", "retried")

    def __init__(self, outcomes: list[Outcome], offsets: dict[int, int], *,
                 retried: bool = False, beats: list[Beat] | None = None) -> None:
        self.outcomes = outcomes
        self.offsets = offsets  # partition -> offset of the next record to read
        self.retried = retried
        self.beats = beats or []
