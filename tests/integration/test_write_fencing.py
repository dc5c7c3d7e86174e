"""A paused dispatcher's late writes lose to the next owner's, against the real Cassandra.

A dispatcher decides a put, is paused (SIGSTOP) before sending it, and its partition's next
owner meanwhile stores and cancels the same task. When the first one resumes, its write is
stamped no later than the end of its lease, so the cancel, written after it, stands. The
fence is the partition's own: a partition given up long ago does not hold back the writes
of one held now.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from celery_scheduler.envelope import ScheduleEnvelope
from celery_scheduler.errors import LeaseEndedError
from celery_scheduler.keys import TaskKey
from celery_scheduler.store.base import Cursor, State, bucket_of
from celery_scheduler.store.cassandra import CassandraScheduleStore

pytestmark = pytest.mark.cassandra


@pytest.fixture
def stores(cassandra_contact: str, unique_name: str) -> Iterator[tuple[CassandraScheduleStore, ...]]:
    host, port = cassandra_contact.rsplit(":", 1)
    opened = [CassandraScheduleStore([host], unique_name, port=int(port), consistency="ONE",
                                     serial_consistency="SERIAL") for _ in range(2)]
    opened[0].create_schema()
    yield tuple(opened)
    opened[0]._session.execute(f"DROP KEYSPACE IF EXISTS {unique_name}")
    for store in opened:
        store.close()


def test_a_put_sent_after_its_writers_leases_ended_does_not_undo_a_later_cancel(
        stores: tuple[CassandraScheduleStore, CassandraScheduleStore]) -> None:
    paused, next_owner = stores
    now = int(time.time() * 1000)
    envelope = ScheduleEnvelope(TaskKey("o", now + 60_000, "u"), "proj.remind")
    # the paused dispatcher read the key's status (unknown) and planned its put ...
    statements, _ = paused._plan_put(0, envelope, None, now)
    # ... its leases ended 20 s ago by its own clock; the next owner stored and cancelled it
    paused.fence_writes(lambda partition: time.time() - 20)
    assert next_owner.put(0, envelope, now) is not None
    assert next_owner.cancel(0, envelope.key, now)
    paused._cql.batch("the late put", 0, statements)  # the paused one resumes and sends it

    status = next_owner.status(envelope.key)
    assert status is not None and status.state is State.CANCELLED
    assert next_owner.read(0, Cursor(bucket_of(envelope.key.scheduled_ms, 60)), 10) == []


def test_writes_within_the_leases_are_stamped_now(
        stores: tuple[CassandraScheduleStore, CassandraScheduleStore]) -> None:
    owner, other = stores
    owner.fence_writes(lambda partition: time.time() + 10)  # leases valid for 10 s more
    now = int(time.time() * 1000)
    envelope = ScheduleEnvelope(TaskKey("o", now + 60_000, "u"), "proj.remind")
    assert other.put(0, envelope, now) is not None
    assert owner.cancel(0, envelope.key, now)  # after the other's put, and stamped after it
    status = other.status(envelope.key)
    assert status is not None and status.state is State.CANCELLED


def test_a_partition_taken_back_is_fenced_at_its_own_lease_not_at_one_given_up(
        stores: tuple[CassandraScheduleStore, CassandraScheduleStore]) -> None:
    taken_back, other = stores
    now = int(time.time() * 1000)
    # partition 0 is held again now; partition 1 was given up, and its fence is long past
    taken_back.fence_writes({0: time.time() + 10, 1: time.time() - 20}.get)
    envelopes = [ScheduleEnvelope(TaskKey(f"o{n}", now + 60_000, "u"), "proj.remind")
                 for n in range(2)]
    stored = [other.put(n, envelope, now) for n, envelope in enumerate(envelopes)]
    assert None not in stored
    # both finished in one concurrent write: each request carries its own partition's stamp
    taken_back.finish_many([task for task in stored if task is not None], State.SUCCEEDED, now)

    held_now, given_up = (other.status(envelope.key) for envelope in envelopes)
    assert held_now is not None and held_now.state is State.SUCCEEDED
    assert given_up is not None and given_up.state is State.PENDING  # the late write lost


def test_writes_of_partitions_held_now_share_requests_and_stand(
        stores: tuple[CassandraScheduleStore, CassandraScheduleStore], monkeypatch: pytest.MonkeyPatch
        ) -> None:
    owner, other = stores
    owner.fence_writes(lambda partition: time.time() + 10)  # every lease valid for 10 s more
    now = int(time.time() * 1000)
    envelopes = [ScheduleEnvelope(TaskKey(f"o{n}", now + 60_000, "u"), "proj.remind") for n in range(4)]
    stored = [other.put(n, envelope, now) for n, envelope in enumerate(envelopes)]
    assert None not in stored
    owner.check_schema()  # as a dispatcher does at start: reads the status layout
    sent: list[object] = []
    execute_async = owner._session.execute_async

    def counted(request: object, *args: object, **kwargs: object) -> object:
        sent.append(request)
        return execute_async(request, *args, **kwargs)

    monkeypatch.setattr(owner._session, "execute_async", counted)
    owner.finish_many([task for task in stored if task is not None], State.SUCCEEDED, now)
    assert len(sent) == 1  # four partitions' rows and statuses in one request
    for envelope in envelopes:  # stamped after the other's puts: the completions stand
        status = other.status(envelope.key)
        assert status is not None and status.state is State.SUCCEEDED
    assert other.read(0, Cursor(bucket_of(now + 60_000, 60)), 10) == []


def test_a_decision_sent_after_its_leases_end_is_refused_when_asked_not_stamped_at_the_fence(
        stores: tuple[CassandraScheduleStore, CassandraScheduleStore]) -> None:
    """A periodic occurrence fired from what was read: the next owner decided otherwise and
    wrote nothing, so a write held at the fence would stay. Within refusing_late_writes it is
    not sent; outside, the same write is sent and stays (what the firer no longer does)."""
    paused, other = stores
    now = int(time.time() * 1000)
    refused, sent = (ScheduleEnvelope(TaskKey(o, now + 60_000, "u"), "proj.report") for o in "ab")
    paused.fence_writes(lambda partition: time.time() - 20)  # its leases ended 20 s ago
    with paused.refusing_late_writes(), pytest.raises(LeaseEndedError, match="partition 0 was not sent"):
        paused.put(0, refused, now)
    assert other.status(refused.key) is None
    assert other.read(0, Cursor(bucket_of(now + 60_000, 60)), 10) == []
    assert paused.put(0, sent, now) is not None  # held at the fence, and nothing wrote after it
    status = other.status(sent.key)
    assert status is not None and status.state is State.PENDING
