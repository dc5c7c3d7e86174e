"""Whether this dispatcher's Kafka consumer has fallen out of its group and should join again.

After a broker restart, librdkafka's consumer sometimes times out its session, revokes its
partitions, and then never gets back into the group: its request to the group coordinator
waits in a queue that is never sent, and is timed out every minute, for as long as the
process runs. Kafka then assigns the topic to the group's other members; when there are
none (every dispatcher hit the same), no partition has an owner and nothing is released
until a new dispatcher process joins.

A dispatcher that has held no partition for ``unassigned_seconds`` therefore looks at the
partition leases: one that nobody has renewed for ``orphan_seconds`` past its end has no
owner. Kafka would have given it to any member of the group, so this dispatcher is taken to
be out of it and replaces its consumer. A dispatcher that merely has nothing to do (more
dispatchers than partitions) finds every lease renewed, and keeps its consumer.

A broker restart also ends every dispatcher's group session at once: librdkafka reports
the partitions *lost*, and the group forms again only after Kafka is back and the old
members' sessions ran out on the broker too (another ``session.timeout.ms``). A dispatcher
that dropped what it holds then would release nothing of those partitions for all that
time, and then read their schedules again. Their leases in Cassandra, not the group, fence
who releases from them, so a dispatcher keeps releasing from a lost partition while it
holds its lease, until the group assigns again (then it keeps what it gets and gives up the
rest), its lease is gone, or ``lost_hold_seconds`` have passed; and it reads what arrives on
them meanwhile (:mod:`celery_scheduler.dispatcher.kept`).

A partition whose lease the engine holds but which is neither assigned here nor kept (a
revocation that did not reach the engine, say) would be renewed for as long as the process
runs while nothing here reads it, and its tasks would wait at the caught-up gate of the
dispatcher Kafka gave it to. One found so for ``stray_seconds`` is handed over.

Only the decisions are here; the dispatcher (:mod:`celery_scheduler.dispatcher.service`) reads
the leases, replaces the consumer and hands partitions over.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from celery_scheduler.store.base import Lease

__all__ = ["Membership"]

# How long a dispatcher goes without a partition before it looks at the leases: a rebalance
# after a member's session times out (6 s) takes a few seconds more.
UNASSIGNED_SECONDS = 20.0
# How long past its end a lease must be to count as ownerless: its owner renews it a third
# of the way through, and another dispatcher's clock may be off by a few seconds.
ORPHAN_SECONDS = 10.0
# Between two looks at the leases, and after a new consumer, before it is judged again.
CHECK_SECONDS = 5.0
# How long a dispatcher goes on releasing from partitions Kafka took from it with its
# session, while it holds their leases: the length of a broker restart, plus a session
# timeout (6 s) for the group to form again. Longer, and a partition the group gave to
# another dispatcher waits longer for its lease when this one's consumer does not rejoin.
LOST_HOLD_SECONDS = 20.0
# How long a partition may be leased here while neither assigned nor kept before it is
# handed over: longer than a revocation's hand-over takes (the sender settles for up to
# release_ahead_seconds + 5 s) and than a lost partition is kept.
STRAY_SECONDS = 45.0


class Membership:
    """Tracks this dispatcher's assignment and says when to look at the leases, and what
    they show. Times are the caller's monotonic seconds and epoch milliseconds."""

    def __init__(self, partitions: int, started: float, *,
                 unassigned_seconds: float = UNASSIGNED_SECONDS,
                 orphan_seconds: float = ORPHAN_SECONDS,
                 check_seconds: float = CHECK_SECONDS,
                 lost_hold_seconds: float = LOST_HOLD_SECONDS,
                 stray_seconds: float = STRAY_SECONDS) -> None:
        self.partitions = partitions
        self.unassigned_seconds = unassigned_seconds
        self.orphan_ms = int(orphan_seconds * 1000)
        self.check_seconds = check_seconds
        self.lost_hold_seconds = lost_hold_seconds
        self.stray_seconds = stray_seconds
        self._stray_since: dict[int, float] = {}  # leased, neither held nor kept: since when
        self._held: set[int] = set()
        self._lost: dict[int, float] = {}  # partition -> until when it is kept, unassigned
        self._unassigned_since: float | None = started
        self._next_check = started
        self.rejoins = 0  # consumers replaced so far

    def assigned(self, partitions: Iterable[int], now: float) -> list[int]:
        """Kafka assigned *partitions*; returns the lost partitions to give up now.

        The first assignment after a loss comes once the group formed again: a lost
        partition it did not bring back went to another member, which waits for its lease.
        """
        self._held.update(partitions)
        if self._held:
            self._unassigned_since = None
        gone = self._give_up(lambda number: number not in self._held)
        self._lost.clear()  # the others are this dispatcher's again
        return gone

    def lost(self, partitions: Iterable[int], now: float) -> None:
        """Kafka ended the session and took *partitions*: they are kept a while, unassigned."""
        numbers = list(partitions)
        self.revoked(numbers, now)
        for number in numbers:
            self._lost[number] = now + self.lost_hold_seconds

    @property
    def kept(self) -> list[int]:
        """The lost partitions still kept."""
        return sorted(self._lost)

    def lost_to_give_up(self, now: float, leased: Callable[[int], bool]) -> list[int]:
        """The lost partitions to give up now: kept long enough, or no longer *leased*."""
        return self._give_up(lambda number: now >= self._lost[number] or not leased(number))

    def _give_up(self, which: Callable[[int], bool]) -> list[int]:
        gone = sorted(number for number in self._lost if which(number))
        for number in gone:
            del self._lost[number]
        return gone

    def strays(self, leased: Iterable[int], now: float) -> list[int]:
        """Those of *leased* (the partitions the engine holds the lease of) that have been
        neither assigned here nor kept for ``stray_seconds``: to hand over now."""
        unread = {number for number in leased if number not in self._held and number not in self._lost}
        self._stray_since = {number: self._stray_since.get(number, now) for number in unread}
        gone = sorted(number for number, since in self._stray_since.items()
                      if now - since >= self.stray_seconds)
        for number in gone:
            del self._stray_since[number]
        return gone

    def revoked(self, partitions: Iterable[int], now: float) -> None:
        self._held.difference_update(partitions)
        if not self._held and self._unassigned_since is None:
            self._unassigned_since = now

    def unassigned_for(self, now: float) -> float:
        """Seconds this dispatcher has held no partition (0 while it holds one)."""
        return 0.0 if self._unassigned_since is None else now - self._unassigned_since

    def due(self, now: float) -> bool:
        """Whether to read the leases now: no partition for long enough, and not looked lately."""
        if self._unassigned_since is None or now - self._unassigned_since < self.unassigned_seconds:
            return False
        if now < self._next_check:
            return False
        self._next_check = now + self.check_seconds
        return True

    def orphaned(self, leases: Iterable[Lease], now_ms: int) -> list[int]:
        """The topic's partitions whose lease nobody holds: none taken, or over for a while."""
        ends = {lease.partition: lease.expires_ms for lease in leases}
        return [number for number in range(self.partitions)
                if ends.get(number, 0) < now_ms - self.orphan_ms]

    def rejoined(self, now: float) -> list[int]:
        """A new consumer joins: give it as long as a fresh start before judging it.

        Returns the lost partitions still kept, to give up: the new consumer starts afresh.
        """
        self.rejoins += 1
        self._held.clear()
        self._unassigned_since = now
        self._next_check = now
        return self._give_up(lambda number: True)
