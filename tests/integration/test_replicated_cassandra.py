"""A node of a replicated Cassandra cluster is killed: the store goes on and loses nothing.

The keyspace is the one ``scheduler init`` makes with ``scheduler_cassandra_replication`` at
replication factor 3, and the store writes and reads at LOCAL_QUORUM and takes partition
leases with lightweight transactions at LOCAL_SERIAL (the settings' defaults): an
acknowledged write is on two of the three replicas, and any two of them answer. The nodes
of scripts/cassandra-cluster sync their commit logs before they acknowledge, so a SIGKILLed
node comes back with everything it acknowledged.

The two tests share one history: what was acknowledged before the kill (the ``outage``
fixture) and while the node was down (the first test) is what the second test reads back
once the node is restarted.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import pytest
from cassandra.policies import HostStateListener
from cassandra.pool import Host

from celery_scheduler.config import Settings
from celery_scheduler.envelope import ScheduleEnvelope
from celery_scheduler.errors import StoreUnavailableError
from celery_scheduler.keys import TaskKey
from celery_scheduler.store import open_store
from celery_scheduler.store.base import Cursor, Lease, ScheduleStore, State, bucket_of
from celery_scheduler.store.cassandra import CassandraScheduleStore
from celery_scheduler.store.cqlsession import (
    HEARTBEAT_SECONDS,
    HEARTBEAT_TIMEOUT_SECONDS,
    SPECULATE_AFTER_SECONDS,
)
from tests.integration.cassandra_cluster import CassandraCluster, cassandra_cluster  # noqa: F401
from tests.waiting import wait_until

# serial: three nodes of its own, killed and stalled, beside no other test
pytestmark = [pytest.mark.cassandra, pytest.mark.serial]

# The node killed: the seed and the first contact point, so the driver loses its control
# connection as well.
VICTIM = 1
TASKS = 24  # scheduled before the kill, and as many again while the node is down
PARTITIONS = 4  # Kafka partitions the tasks are spread over, and leased
LEASE_MS = 60_000
T = TypeVar("T")
# A lightweight transaction may time out on the server while the others have not yet seen
# the node die (it answers no Paxos round until gossip convicts it); a dispatcher tries a
# lease renewal again on its next tick, a third of the lease later. The test tries again
# every second, for as long.
LWT_RETRY_SECONDS = LEASE_MS / 3000


@dataclass
class Outage:
    settings: Settings
    store: CassandraScheduleStore
    at_ms: int  # when every task is due: far enough ahead to stay pending
    acknowledged: dict[TaskKey, State]  # each acknowledged key and its latest state
    leases: list[Lease]  # dispatcher-a's, kept renewed


def now_ms() -> int:
    return int(time.time() * 1000)


def envelope(n: int, at_ms: int) -> ScheduleEnvelope:
    return ScheduleEnvelope(key=TaskKey(f"acct-{n % 6}", at_ms, f"step-{n}"),
                            task="proj.remind", args=[n])


def schedule(outage: Outage, first: int) -> None:
    """Store TASKS tasks numbered from *first*, recording each one acknowledged."""
    for n in range(first, first + TASKS):
        task = envelope(n, outage.at_ms)
        assert outage.store.put(n % PARTITIONS, task, now_ms()) is not None
        outage.acknowledged[task.key] = State.PENDING


def as_a_dispatcher_would(call: Callable[[], T], what: str,
                          done: Callable[[T], bool] = lambda _: True) -> T:
    """*call* (a lease renewal or take), made again while Cassandra says it is unavailable
    or until it is *done*, as a dispatcher does on its next ticks. A take whose round timed
    out may still have been applied: the quorum read of the next try does not see it yet, and
    its round, which finishes the first one, then finds the epoch changed and takes nothing;
    the try after that sees the partitions as its own and takes them."""
    deadline = time.monotonic() + LWT_RETRY_SECONDS
    while True:
        try:
            result = call()
            if done(result) or time.monotonic() > deadline:
                return result
            print(f"{what} took {result}, trying again")
        except StoreUnavailableError as exc:
            if time.monotonic() > deadline:
                raise
            print(f"{what} failed, trying again: {exc}")
        time.sleep(1)


def check_everything_reads_back(outage: Outage, store: ScheduleStore) -> None:
    keys = list(outage.acknowledged)
    states = {status.key: status.state for status in store.statuses(keys) if status is not None}
    assert states == outage.acknowledged
    bucket = bucket_of(outage.at_ms, outage.settings.bucket_seconds)
    rows = {row.key for partition in range(PARTITIONS)
            for row in store.read(partition, Cursor(bucket), 1000)}
    assert rows == {key for key, state in outage.acknowledged.items() if state is State.PENDING}


def host_of(store: CassandraScheduleStore, cluster: CassandraCluster, node: int) -> Host:
    """The driver's host of the cluster's *node*."""
    address = cluster.address(node)
    return next(host for host in store._cluster.metadata.all_hosts() if host.address == address)


def at_all(settings: Settings) -> ScheduleStore:
    """A store of the same keyspace that needs every replica for each request."""
    return open_store(settings.replace(cassandra_consistency="ALL",
                                       cassandra_serial_consistency="SERIAL"))


@pytest.fixture(scope="module")
def outage(cassandra_cluster: CassandraCluster) -> Iterator[Outage]:  # noqa: F811
    """Tasks and leases in a keyspace made as `init` makes it at RF 3, then VICTIM SIGKILLed."""
    settings = Settings.from_mapping({
        "scheduler_cassandra_contact_points": cassandra_cluster.contact_points,
        "scheduler_cassandra_port": cassandra_cluster.port,
        "scheduler_cassandra_keyspace": f"t_{uuid.uuid4().hex[:12]}",
        "scheduler_cassandra_replication": {"class": "SimpleStrategy", "replication_factor": 3},
    })
    assert (settings.cassandra_consistency, settings.cassandra_serial_consistency) == (
        "LOCAL_QUORUM", "LOCAL_SERIAL")
    store = open_store(settings)
    assert isinstance(store, CassandraScheduleStore)
    try:
        store.create_schema(status_shards=settings.kafka_partitions)  # as `init` does
        [row] = store._session.execute("SELECT replication FROM system_schema.keyspaces"
                                       " WHERE keyspace_name = %s", (store.keyspace,))
        assert row.replication["replication_factor"] == "3"
        history = Outage(settings, store, now_ms() + 3_600_000, {}, [])
        schedule(history, 0)
        history.leases = list(store.acquire_leases(range(PARTITIONS), "dispatcher-a", LEASE_MS,
                                                   now_ms()).values())
        assert len(history.leases) == PARTITIONS
        cassandra_cluster.kill(VICTIM)
        # The driver sees the node's connections close at once; waiting for that keeps a
        # request from being sent to a node already dead, which would fail it.
        victim = host_of(store, cassandra_cluster, VICTIM)
        wait_until(lambda: not victim.is_up, 30, lambda: f"the driver still has {victim} up")
        yield history
    finally:
        store.close()


def test_with_a_node_killed_tasks_are_stored_and_read_and_partitions_leased(
        outage: Outage) -> None:
    store = outage.store
    started = time.monotonic()
    # when: more tasks are scheduled, and some of the first ones run
    schedule(outage, TASKS)
    for key in list(outage.acknowledged)[:6]:
        task = store.task(key)
        assert task is not None
        store.mark_released(task, 1, now_ms() + LEASE_MS, now_ms())
        store.finish(task, State.SUCCEEDED, None, now_ms())
        outage.acknowledged[key] = State.SUCCEEDED
    # then: every acknowledged key reads back at LOCAL_QUORUM, pending ones in the schedule
    check_everything_reads_back(outage, store)
    # and: leases are renewed and taken by lightweight transactions, and stay exclusive
    renewed = as_a_dispatcher_would(
        lambda: store.renew_leases(outage.leases, LEASE_MS, now_ms()), "a renewal")
    assert None not in renewed
    outage.leases = [lease for lease in renewed if lease is not None]
    taken = as_a_dispatcher_would(lambda: store.acquire_leases(
        range(PARTITIONS, 2 * PARTITIONS), "dispatcher-b", LEASE_MS, now_ms()), "a take",
        lambda taken: len(taken) == PARTITIONS)
    assert sorted(taken) == list(range(PARTITIONS, 2 * PARTITIONS))
    assert as_a_dispatcher_would(lambda: store.acquire_leases(
        range(PARTITIONS), "dispatcher-b", LEASE_MS, now_ms()), "a take") == {}
    as_a_dispatcher_would(lambda: store.release_lease(taken[PARTITIONS]), "a release")
    assert list(as_a_dispatcher_would(lambda: store.acquire_leases(
        [PARTITIONS], "dispatcher-c", LEASE_MS, now_ms()), "a take", bool)) == [PARTITIONS]
    took = time.monotonic() - started
    # and: a read that needs every replica is refused: the node really is gone
    with at_all(outage.settings) as everyone, pytest.raises(StoreUnavailableError):
        everyone.statuses(list(outage.acknowledged)[:1])
    print(f"{len(outage.acknowledged)} tasks and {2 * PARTITIONS + 1} leases with node {VICTIM} "
          f"down in {took:.1f}s")


def test_a_restarted_node_serves_all_that_was_acknowledged(
        cassandra_cluster: CassandraCluster, outage: Outage) -> None:  # noqa: F811
    # when: the killed node is started again (it replays its commit log)
    started = time.monotonic()
    cassandra_cluster.start(VICTIM)
    restart = time.monotonic() - started
    # then: reads that need every replica, the restarted node's too, work again and find
    # everything acknowledged before and during its loss
    with at_all(outage.settings) as everyone:
        check_everything_reads_back(outage, everyone)
    # and: the store that lived through the outage goes on, its leases with it
    check_everything_reads_back(outage, outage.store)
    assert None not in outage.store.renew_leases(outage.leases, LEASE_MS, now_ms())
    print(f"node {VICTIM} restarted in {restart:.0f}s; {len(outage.acknowledged)} tasks read at ALL")


STALLED = 2  # not the node restarted above: its peers have long seen it up
READS, PUTS, RENEWALS = 48, 12, 20
# A request waits this long at most with a node stalled: the driver sends it to another
# replica after half a second (SPECULATE_AFTER_SECONDS); without that, a third of them waited
# the whole request timeout (10 s) for the stalled coordinator and failed. Most take half a
# second or one. The other coordinators still count the stalled node as up until gossip
# convicts it, and one that asked it for the second of its two answers waits for it until
# Cassandra's own read timeout (SERVER_READ_TIMEOUT_SECONDS, read_request_timeout), then
# the driver tries the next: in six runs the slowest read took 1.0, 2.5, 2.5, 3.0, 3.3 and
# 5.5 s.
SERVER_READ_TIMEOUT_SECONDS = 5.0
STALLED_BOUND_SECONDS = SERVER_READ_TIMEOUT_SECONDS + SPECULATE_AFTER_SECONDS + 1
# The driver marks a node down that answers no heartbeat: one goes out after
# HEARTBEAT_SECONDS of silence and waits HEARTBEAT_TIMEOUT_SECONDS (with the driver's
# defaults, 30 s and 30 s: a 30 s stall went unseen). The bound leaves a second for the
# heartbeat thread's round.
MARKED_DOWN_WITHIN = HEARTBEAT_SECONDS * 2 + HEARTBEAT_TIMEOUT_SECONDS + 1
# A lease renewal is a lightweight transaction, never sent twice: one coordinated by the
# stalled node fails after LWT_TIMEOUT_SECONDS. Once the node is marked down none is, and
# each renewal is answered within RENEWAL_BOUND_SECONDS. Until the other nodes convict the
# stalled one, a Paxos round they coordinate may still time out on the server (its CAS
# contention timeout, 1 s): one renewal of twenty did in one run of four, and once, on a
# loaded machine, at its write timeout (2 s; it failed after 2.5 s). The dispatcher tries
# again a third of the lease later, so a renewal that fails within 3 s still leaves the
# next one time before a partition lease (6 s by default) ends; RENEWAL_FAILURES of them
# are allowed.
RENEWAL_BOUND_SECONDS = 0.5
RENEWAL_FAILED_WITHIN = 3.0
RENEWAL_FAILURES = 2


class DownTimes(HostStateListener):  # type: ignore[misc]
    """When the driver marked each host down (time.monotonic())."""

    def __init__(self) -> None:
        self.at: dict[Host, float] = {}

    def on_down(self, host: Host) -> None:
        self.at.setdefault(host, time.monotonic())

    def on_up(self, host: Host) -> None:
        pass

    def on_add(self, host: Host) -> None:
        pass

    def on_remove(self, host: Host) -> None:
        pass


def test_a_stalled_node_fails_no_request_and_is_marked_down_within_seconds(
        cassandra_cluster: CassandraCluster, outage: Outage) -> None:  # noqa: F811
    store = outage.store
    # Run without the restart test before it, the node the fixture killed is still down, and
    # with a second node stalled no quorum would be left: start it as that test does.
    victim = host_of(store, cassandra_cluster, VICTIM)
    if not victim.is_up:
        cassandra_cluster.start(VICTIM)
        wait_until(lambda: victim.is_up, 60, lambda: f"the driver has not found {victim} again")
    check_everything_reads_back(outage, store)  # every node is up, and the driver knows it
    stalled = host_of(store, cassandra_cluster, STALLED)
    downs = DownTimes()
    store._cluster.register_listener(downs)
    cassandra_cluster.stop(STALLED)
    stopped = time.monotonic()
    try:
        keys = list(outage.acknowledged)
        reads: list[float] = []
        for n in range(READS):
            started = time.monotonic()
            assert store.status(keys[n % len(keys)]) is not None
            reads.append(time.monotonic() - started)
        puts: list[float] = []
        for n in range(2 * TASKS, 2 * TASKS + PUTS):
            task = envelope(n, outage.at_ms)
            started = time.monotonic()
            assert store.put(n % PARTITIONS, task, now_ms()) is not None
            puts.append(time.monotonic() - started)
            outage.acknowledged[task.key] = State.PENDING
        wait_until(lambda: stalled in downs.at, MARKED_DOWN_WITHIN,
                   lambda: f"the driver still has the stalled {stalled} up")
        marked_down = downs.at[stalled] - stopped
        renewals: list[float] = []
        failed: list[tuple[float, StoreUnavailableError]] = []
        for _ in range(RENEWALS):
            started = time.monotonic()
            try:
                renewed = store.renew_leases(outage.leases, LEASE_MS, now_ms())
            except StoreUnavailableError as exc:
                failed.append((time.monotonic() - started, exc))
                continue
            renewals.append(time.monotonic() - started)
            assert None not in renewed
            outage.leases = [lease for lease in renewed if lease is not None]
    finally:
        cassandra_cluster.cont(STALLED)
    resumed = time.monotonic()
    wait_until(lambda: stalled.is_up, 30, lambda: f"the driver has not found {stalled} again")
    print(f"node {STALLED} stalled: slowest of {READS} reads {max(reads):.2f}s, "
          f"of {PUTS} puts {max(puts):.2f}s; marked down after {marked_down:.1f}s, slowest of "
          f"{RENEWALS} lease renewals after that {max(renewals):.2f}s, {len(failed)} failed "
          f"{[round(took, 2) for took, _ in failed]}; up again "
          f"{time.monotonic() - resumed:.1f}s after it woke")
    assert max(reads) < STALLED_BOUND_SECONDS and max(puts) < STALLED_BOUND_SECONDS
    assert marked_down < MARKED_DOWN_WITHIN and max(renewals) < RENEWAL_BOUND_SECONDS
    assert len(failed) <= RENEWAL_FAILURES, failed
    assert all(took < RENEWAL_FAILED_WITHIN for took, _ in failed), failed
    check_everything_reads_back(outage, store)
