"""A partition's lease holder and its Kafka reader may differ for a while; order still holds.

The long chaos run found it (52 order violations, ``RELIABILITY.md``): after a Kafka restart
one dispatcher's consumer stopped reading (its loop hung in a synchronous offset commit) while
its engine kept renewing the partitions' leases. Kafka gave the partitions to a second
dispatcher, which wrote their new tasks to Cassandra without holding the leases. The holder,
whose schedule was already loaded past the earlier of two tasks, never saw it, loaded the
later one when its load window reached it, and released that first.

Here the stale holder is an engine in the test process that holds every lease and reads
nothing from Kafka; the reader is a real dispatcher subprocess.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from celery_scheduler.config import get_settings
from celery_scheduler.dispatcher.engine import Engine, EngineSettings
from celery_scheduler.envelope import ScheduleEnvelope
from celery_scheduler.keys import TaskKey
from celery_scheduler.partitioner import partition_for
from celery_scheduler.store import open_store
from tests.integration.dispatch_fixtures import Scheduler
from tests.integration.dispatch_fixtures import schedule as schedule  # the fixtures
from tests.integration.dispatch_fixtures import scheduler as scheduler
from tests.waiting import wait_until


def test_a_lease_holder_that_reads_nothing_never_runs_a_later_task_first(
        scheduler: Scheduler, schedule: Any) -> None:
    from tests.apps import dispatching

    settings = get_settings(dispatching.app).replace(
        kafka_topic=scheduler.env["CELERY_SCHEDULER_TEST_TOPIC"],
        cassandra_keyspace=scheduler.env["CELERY_SCHEDULER_TEST_KEYSPACE"])
    store = open_store(settings)
    released: list[tuple[str, str]] = []
    stale = Engine(store, lambda task, _: released.append((task.key.ordering_id, task.key.uniqueness_key)),
                   "stale-holder", EngineSettings(partition_lease_seconds=6, lookahead_seconds=3))
    partitions = range(settings.kafka_partitions)
    stale.assign(partitions)
    stale.start()
    try:
        wait_until(lambda: all(p.lease is not None for p in list(stale.partitions.values()))
                   and len(stale.partitions) == len(partitions), 30, lambda: stale.partitions)

        # a task of another ordering id in the same partition, due after seq 0: the holder
        # loads it, and its cursor is then past where seq 0 will be written
        partition = partition_for("split", settings.kafka_partitions)
        anchor, marker = [o for o in (f"anchor-{n}" for n in range(1000))
                          if partition_for(o, settings.kafka_partitions) == partition][:2]
        now = datetime.now(UTC)

        def written_by_the_holder(ordering_id: str, seconds: float) -> None:
            at_ms = int((now + timedelta(seconds=seconds)).timestamp() * 1000)
            stored = store.put(partition, ScheduleEnvelope(
                key=TaskKey(ordering_id, at_ms, "seq-0"), task="dispatching.record",
                args=[ordering_id, 0]), at_ms - 6000)
            assert stored is not None
            # the holder wrote it while it still read Kafka: its ingest told the engine,
            # which loads the row now rather than at its next safety fill (up to ten seconds
            # away: the holder would load the anchor then, or release it first)
            stale.persisted(stored)

        written_by_the_holder(anchor, 6)
        wait_until(lambda: stale.timetable.count(partition) == 1, 10,
                   lambda: f"the holder did not load the anchor task (released {released})")
        # due after seq 1, of an ordering id of its own: once the holder released it, it has
        # passed seq 1's due time with seq 1 in its window
        written_by_the_holder(marker, 11)

        reader = scheduler.dispatcher(wait=False)
        scheduler.wait_for_log(reader, "assigned partitions [0, 1, 2, 3, 4, 5]")
        scheduler.worker()
        dispatching.record.schedule_at(now + timedelta(seconds=3), "split", 0)
        dispatching.record.schedule_at(now + timedelta(seconds=10), "split", 1)

        wait_until(lambda: (marker, "seq-0") in released, 30,
                   lambda: f"the holder did not release the marker task (released {released})")
        split = [unique for ordering_id, unique in released if ordering_id == "split"]
        assert split == [], f"the lease holder released {split} of an ordering id it never read"
    finally:
        stale.stop()  # gives the leases up: the reader takes them over
        store.close()

    def split_starts() -> list[dict[str, Any]]:
        return sorted((s for s in scheduler.starts() if s["o"] == "split"), key=lambda s: s["t"])

    wait_until(lambda: len(split_starts()) >= 2, 60, split_starts)
    starts = split_starts()
    assert [s["seq"] for s in starts] == [0, 1]
