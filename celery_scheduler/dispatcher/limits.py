"""What the operators' rate limits let a dispatcher release, and when.

:class:`Limiter` is pure: the timetable asks it to book a release slot for each head it is
about to take (:meth:`Limiter.book`), and parks the head until that slot if it is later than
now. A task name's limit is shared among the dispatchers by the partitions each holds (one
holding a third of them releases a third of the rate), so the whole group keeps to it when
the name's tasks are spread over the partitions; an ordering id's limit is its own
dispatcher's, since one dispatcher owns it.

Slots are booked once per release, as in the generic cell rate algorithm: each limit keeps
the earliest time its next release may go (``next_ms``), a booking takes ``max(at, next_ms)``
and moves it one interval on. A head due behind a backlog is given its slot and waits for it
in the timetable's heap, never looked at again before: a backlog of ten thousand costs ten
thousand bookings, not ten thousand per step. No credit is saved up while a limit is idle:
a burst after a quiet time goes at the limit's pace from its first release.
"""

from __future__ import annotations

from collections.abc import Iterable

from celery_scheduler.store.records import PauseScope, RateLimit

__all__ = ["Limiter"]


class Limiter:
    """The rate limits in force and the next free slot of each; used from one thread."""

    def __init__(self) -> None:
        self._task_rates: dict[str, float] = {}  # task name -> releases a second, across the group
        self._id_rates: dict[str, float] = {}  # ordering id -> releases a second
        self.share = 1.0  # the part of the group's rate this dispatcher takes (its partitions')
        self._next_ms: dict[tuple[PauseScope, str], float] = {}
        self.delayed = 0  # releases put off to a later slot, since start

    def __bool__(self) -> bool:
        return bool(self._task_rates or self._id_rates)

    def update(self, limits: Iterable[RateLimit], share: float | None = None) -> None:
        """The limits in force from now on, and this dispatcher's *share* of the partitions,
        if given. Every slot is free again: the timetable books its waiting heads anew (see
        ``Timetable.limit_by``)."""
        kept = list(limits)
        self._task_rates = {r.value: r.per_second for r in kept if r.scope is PauseScope.TASK}
        self._id_rates = {r.value: r.per_second for r in kept if r.scope is PauseScope.ORDERING_ID}
        if share is not None:
            self.share = share
        self._next_ms = {}

    def rate_of(self, task: str) -> float | None:
        """The releases a second this dispatcher makes of *task* at most (None: no limit,
        or no partition held: nothing is released then anyway)."""
        rate = self._task_rates.get(task)
        return None if rate is None or self.share <= 0 else rate * self.share

    def book(self, task: str, ordering_id: str, at_ms: int) -> int:
        """Book the release of a task of *task* and *ordering_id* at *at_ms* or the first
        free slot after it; return the slot (epoch ms)."""
        limits = []
        rate = self.rate_of(task)
        if rate is not None:
            limits.append(((PauseScope.TASK, task), rate))
        own = self._id_rates.get(ordering_id)
        if own is not None:
            limits.append(((PauseScope.ORDERING_ID, ordering_id), own))
        if not limits:
            return at_ms
        slot = max([float(at_ms)] + [self._next_ms.get(name, 0.0) for name, _ in limits])
        for name, per_second in limits:
            self._next_ms[name] = slot + 1000.0 / per_second
        booked = -int(-slot // 1)  # whole milliseconds, rounded up
        if booked > at_ms:
            self.delayed += 1
        return booked

    def describe(self) -> str:
        parts = [f"task {name!r} {rate:g}/s (here {rate * self.share:g}/s)"
                 for name, rate in sorted(self._task_rates.items())]
        parts += [f"ordering id {name!r} {rate:g}/s" for name, rate in sorted(self._id_rates.items())]
        return ", ".join(parts) or "none"

