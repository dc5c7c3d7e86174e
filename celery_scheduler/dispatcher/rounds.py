"""The order in which a batch's records are written: rounds, one write request each.

Each round holds at most one operation per ordering id (or a run of cancels of it, each of
its own key: they do not depend on each other, and a bulk cancel sends thousands), and a
later record of the same ordering id (the next task, or a cancel after its schedule) goes
to a later round. Records of one ordering id so take effect in the order Kafka delivered
them, and a batch that fails half-way never leaves a later task stored without an earlier
one (which the engine could then run first).

A batch holds at most ``MOST_ROUNDS`` rounds: each is a request or two that waits for the one
before, so a batch of a thousand records of one ordering id (a hot one, scheduled in bulk)
would make a thousand in a row while every other record of the batch waits. The records
past the last round are carried to the next batch (see carrying.py).
"""

from __future__ import annotations

from celery_scheduler.envelope import CancelEnvelope, Envelope, RescheduleEnvelope, RetryEnvelope
from celery_scheduler.store.records import Cancel, Operation, Put, Reschedule, Retry

__all__ = ["MOST_ROUNDS", "Rounds", "operation_of"]

# Rounds in one batch; the operations that would need more wait for the next (carrying.py).
MOST_ROUNDS = 32


def operation_of(envelope: Envelope, partition: int, data: bytes | None = None) -> Operation:
    """What writing *envelope*, read from *partition* as *data*, does to the store."""
    if isinstance(envelope, CancelEnvelope):
        return Cancel(partition, envelope.key)
    if isinstance(envelope, RetryEnvelope):
        return Retry(partition, envelope.key)
    if isinstance(envelope, RescheduleEnvelope):
        return Reschedule(partition, envelope.key, envelope.to)
    return Put(partition, envelope, data)


class Rounds:
    """A batch's operations, in rounds (see the module)."""

    def __init__(self, most: int = MOST_ROUNDS) -> None:
        self._rounds: list[dict[str, list[Operation]]] = []
        self.most = most

    def add(self, operation: Operation) -> bool:
        """Put *operation* in the first round after those holding its ordering id; False
        (and nothing added) if that would be a round past the last one allowed."""
        ordering_id = operation.key.ordering_id
        rounds = self._rounds
        held = 0  # the rounds holding this ordering id: always the first ones
        while held < len(rounds) and ordering_id in rounds[held]:
            held += 1
        before = rounds[held - 1][ordering_id] if held else []
        if (isinstance(operation, Cancel) and before
                and all(isinstance(op, Cancel) and op.key != operation.key for op in before)):
            before.append(operation)
        elif held < len(rounds):
            rounds[held][ordering_id] = [operation]
        elif held < self.most:
            rounds.append({ordering_id: [operation]})
        else:
            return False
        return True

    def add_run(self, operations: list[Operation]) -> bool:
        """Put *operations*, of one ordering id and distinct keys, together in the first
        round after those holding their ordering id; False (and nothing added) if that would
        be a round past the last one allowed. Only for records that nothing of the engine
        sees until all of them are written (carried ones: see carrying.py)."""
        ordering_id = operations[0].key.ordering_id
        held = 0
        while held < len(self._rounds) and ordering_id in self._rounds[held]:
            held += 1
        if held < len(self._rounds):
            self._rounds[held][ordering_id] = list(operations)
        elif held < self.most:
            self._rounds.append({ordering_id: list(operations)})
        else:
            return False
        return True

    @property
    def rounds(self) -> list[list[Operation]]:
        """The operations of each round, in order."""
        return [[op for ops in round_.values() for op in ops] for round_ in self._rounds]
