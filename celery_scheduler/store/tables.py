"""The parts of the schedule store's interface that keep the periodic entries' and the
operators' own state (see :mod:`celery_scheduler.store.base`, which gathers them into
:class:`~celery_scheduler.store.base.ScheduleStore`)."""

from __future__ import annotations

import abc
from collections.abc import Mapping

from celery_scheduler.store.records import EntryChange, OperatorAction, Pause, PauseScope, RateLimit

__all__ = ["OperatorLog", "PauseTable", "PeriodicLog", "RateLimitTable"]


class PeriodicLog(abc.ABC):
    """The periodic entries' state: what each fired last (see
    :mod:`celery_scheduler.dispatcher.firing`), kept with the partition that fires it and
    written only by its owner; and the changes made to entries at run time."""

    @abc.abstractmethod
    def last_fired(self, partition: int) -> dict[str, int]:
        """Each entry of *partition* that ever fired, and its latest occurrence (epoch ms)."""

    @abc.abstractmethod
    def note_fired(self, partition: int, fired: Mapping[str, int]) -> None:
        """Keep *fired* (entry name to occurrence, epoch ms) as the entries' latest."""

    @abc.abstractmethod
    def entry_changes(self) -> dict[str, EntryChange]:
        """Every entry changed at run time, by name."""

    @abc.abstractmethod
    def change_entry(self, change: EntryChange) -> None:
        """Keep *change* as what was changed of its entry (it replaces the one before)."""

    @abc.abstractmethod
    def forget_entry_change(self, name: str) -> None:
        """The entry is beat_schedule's again (or gone, if it was added at run time)."""


class PauseTable(abc.ABC):
    """The operators' pauses (see :mod:`celery_scheduler.pauses`): few, read by every
    dispatcher every few seconds, written by operators."""

    @abc.abstractmethod
    def pauses(self) -> list[Pause]:
        """Every pause in force."""

    @abc.abstractmethod
    def put_pause(self, pause: Pause) -> None:
        """Keep *pause* (it replaces one of the same scope and value)."""

    @abc.abstractmethod
    def drop_pause(self, scope: PauseScope, value: str) -> None:
        """Forget the pause of *scope* and *value*, if there is one."""


class RateLimitTable(abc.ABC):
    """The operators' rate limits (see :mod:`celery_scheduler.rate_limits`): few, read by
    every dispatcher every few seconds, written by operators."""

    @abc.abstractmethod
    def rate_limits(self) -> list[RateLimit]:
        """Every rate limit in force."""

    @abc.abstractmethod
    def put_rate_limit(self, limit: RateLimit) -> None:
        """Keep *limit* (it replaces one of the same scope and value)."""

    @abc.abstractmethod
    def drop_rate_limit(self, scope: PauseScope, value: str) -> None:
        """Forget the rate limit of *scope* and *value*, if there is one."""


class OperatorLog(abc.ABC):
    """The operators' log (see :mod:`celery_scheduler.audit`): appended to by operators'
    tools, read newest first; each line kept for ``OPERATOR_LOG_DAYS``."""

    @abc.abstractmethod
    def note_action(self, action: OperatorAction) -> None:
        """Append *action*."""

    @abc.abstractmethod
    def actions(self, limit: int, now_ms: int) -> list[OperatorAction]:
        """The last *limit* actions, newest first."""
