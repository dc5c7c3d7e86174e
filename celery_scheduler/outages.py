"""An outage logged once: its first failure, then, when it is over, how long it lasted and how
many failures were not shown. Pure: the caller says what failed, what worked and when, and
logs what it is told to.

A Kafka broker that is away makes librdkafka write a line for every attempt of every client
to reach it (about one a second each), and a Cassandra outage fails every engine step: the
lines that tell an operator what happened drown in the repeats. Each source of failures is
tracked by a key (a client and a broker, or "the schedule store"); a failure of a key
already failing is counted, not shown. The outage ends when the caller says the key works
again (:meth:`Outages.recovered`), or, for sources that report only failures, when none came
for ``quiet`` seconds (:meth:`Outages.quieted`). One still failing after ``remind`` seconds
is shown once more, so a long outage is never silent.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Ended", "Outages"]

K = TypeVar("K", bound=Hashable)


@dataclass
class _Open:
    since: float
    last: float
    hidden: int = 0
    reminded: float = 0.0


@dataclass(frozen=True)
class Ended(Generic[K]):
    """An outage that is over: *key* failed for *lasted* seconds, *hidden* failures unshown."""

    key: K
    lasted: float
    hidden: int

    def describe(self, how: str) -> str:
        hidden = f"; {self.hidden} repeated failure(s) not shown" if self.hidden else ""
        return f"{how} after {self.lasted:.1f}s{hidden}"


class Outages(Generic[K]):
    """The open outages of a process's sources, by key."""

    def __init__(self, quiet: float = 5.0, remind: float = 300.0) -> None:
        self.quiet = quiet
        self.remind = remind
        self._open: dict[K, _Open] = {}

    def failed(self, key: K, now: float) -> bool:
        """Record a failure of *key*; True if it is to be shown (the first of an outage, or a
        reminder that it goes on)."""
        current = self._open.get(key)
        if current is None:
            self._open[key] = _Open(since=now, last=now, reminded=now)
            return True
        current.last = now
        if now - current.reminded >= self.remind:
            current.reminded = now
            return True
        current.hidden += 1
        return False

    def failing(self, key: K) -> bool:
        return key in self._open


    def since(self, key: K) -> float | None:
        current = self._open.get(key)
        return None if current is None else current.since

    def recovered(self, key: K, now: float) -> Ended[K] | None:
        """*key* worked at *now*: the outage it ends, if one was open."""
        current = self._open.pop(key, None)
        if current is None:
            return None
        return Ended(key, now - current.since, current.hidden)

    def all_recovered(self, now: float) -> list[Ended[K]]:
        """Everything worked at *now*: the outages that ends."""
        return [ended for key in list(self._open)
                if (ended := self.recovered(key, now)) is not None]

    def quieted(self, now: float) -> list[Ended[K]]:
        """The outages with no failure for ``quiet`` seconds, ended at their last failure."""
        ended = [key for key, current in self._open.items() if now - current.last >= self.quiet]
        return [Ended(key, current.last - current.since, current.hidden)
                for key in ended for current in [self._open.pop(key)]]

    def __len__(self) -> int:
        return len(self._open)
