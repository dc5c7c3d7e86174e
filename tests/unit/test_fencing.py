"""Write timestamps held, partition by partition, at the end of a dispatcher's leases."""

from __future__ import annotations

import threading
import time

import pytest

from celery_scheduler.dispatcher.engine import Engine, EngineSettings
from celery_scheduler.errors import LeaseEndedError
from celery_scheduler.store.fencing import FencedTimestamps
from celery_scheduler.store.memory import MemoryScheduleStore


def _now_us() -> int:
    return int(time.time() * 1_000_000)


def test_timestamps_are_now_until_the_fence_then_held_there_in_order() -> None:
    wall = [time.time()]  # the wall clock the stamps read, moved by hand
    stamps = FencedTimestamps()
    stamps.wall = lambda: wall[0]
    fence = wall[0] + 0.05
    stamps.fence = lambda partition: fence
    with stamps.writing(0):
        assert stamps() == int(wall[0] * 1_000_000)  # within the lease: now
        wall[0] += 0.1  # past the lease's end
        held = [stamps() for _ in range(3)]
    limit = int(fence * 1_000_000)
    assert held == [limit, limit + 1, limit + 2]  # past it: held, in order
    stamps.fence = lambda partition: None
    with stamps.writing(0):
        assert stamps() == int(wall[0] * 1_000_000)  # no lease: now again


def test_refusing_late_writes_raises_past_the_fence_on_this_thread_only() -> None:
    wall = [time.time()]
    stamps = FencedTimestamps()
    stamps.wall = lambda: wall[0]
    fence = wall[0] + 0.05
    stamps.fence = {3: fence}.get
    with stamps.refusing_late(), stamps.writing(3):
        assert stamps() == int(wall[0] * 1_000_000)  # within the lease: sent, stamped now
        wall[0] += 0.1
        with pytest.raises(LeaseEndedError, match=r"partition 3 was not sent.*0\.050s after") as raised:
            stamps()
        seen: list[int] = []
        other = threading.Thread(target=lambda: seen.append(stamps()))
        other.start()
        other.join()
        assert seen  # another thread's writes are not refused
    assert (raised.value.partition, raised.value.fence_seconds) == (3, fence)
    with stamps.writing(3):
        assert stamps() == int(fence * 1_000_000)  # outside the block: held at the fence


def test_each_partition_is_held_at_its_own_fence() -> None:
    stamps = FencedTimestamps()
    past = time.time() - 20
    stamps.fence = {0: None, 1: past}.get
    with stamps.writing(1):
        held = stamps()
    with stamps.writing(0):
        fresh = stamps()  # a partition held now is not held back by one given up long ago
    assert held < int(past * 1_000_000) + 1000
    assert fresh >= _now_us() - 1000
    with stamps.writing(1):
        assert held < stamps() < int(past * 1_000_000) + 1000  # nor does it push 1 forward
    assert stamps() >= _now_us() - 1000  # a request of no partition (a read): now


def test_the_partition_named_is_the_sending_threads_own() -> None:
    stamps = FencedTimestamps()
    past = time.time() - 20
    stamps.fence = {1: past}.get
    seen: list[int] = []
    with stamps.writing(1):
        other = threading.Thread(target=lambda: seen.append(stamps()))
        other.start()
        other.join()
    assert seen[0] >= _now_us() - 1_000_000  # the other thread named no partition


def test_the_engine_fences_each_partition_at_its_lease_end_and_at_giving_it_up() -> None:
    paused = [0.0]  # seconds the process was stopped for: both of its clocks move on
    engine = Engine(MemoryScheduleStore(), lambda task, release: None, "d1",
                    EngineSettings(partition_lease_seconds=10.0, tick_seconds=0),
                    clock=lambda: int((time.time() + paused[0]) * 1000),
                    monotonic=lambda: time.monotonic() + paused[0])
    assert engine.write_fence(0) is None  # no lease yet: nothing to fence
    engine.assign([0, 1])
    started = time.time()
    engine.step()  # takes both leases
    fence = engine.write_fence(0)
    assert fence is not None and started + 7.0 < fence <= time.time() + 8.0  # 10 s less margin
    engine.revoke([1])  # given up: a write decided before it may still be on its way
    given_up = time.time()
    revoked = engine.write_fence(1)
    assert revoked is not None and abs(revoked - given_up) < 0.05  # held at that moment
    still = engine.write_fence(0)
    assert still is not None and abs(still - fence) < 0.01  # the other keeps its lease end
    assert engine.write_fence(2) is None  # never held
    paused[0] = 3600  # an hour later (a long pause): still fenced there
    held = engine.write_fence(1)
    assert held is not None and abs(held - given_up) < 0.05
    paused[0] = 0
    engine.assign([1])
    engine.step()  # taken back: fenced at the new lease's end
    again = engine.write_fence(1)
    assert again is not None and again > time.time() + 7.0


def test_a_shared_stamp_is_now_above_every_partitions_last_write() -> None:
    wall = [time.time()]
    stamps = FencedTimestamps()
    stamps.wall = lambda: wall[0]
    stamps.fence = lambda partition: wall[0] + 10  # every lease held for 10 s more
    with stamps.writing(1):
        first = stamps()
    shared = stamps.shared({0, 1, 2})
    assert shared is not None and shared >= int(wall[0] * 1_000_000) and shared > first
    with stamps.writing(0):
        assert stamps() > shared  # each partition's later writes still come after it
    with stamps.writing(None, shared):
        assert stamps() == shared  # a request sent with it carries it


def test_no_stamp_is_shared_past_any_partitions_fence() -> None:
    wall = [time.time()]
    stamps = FencedTimestamps()
    stamps.wall = lambda: wall[0]
    given_up = wall[0] - 20
    stamps.fence = {0: wall[0] + 10, 1: given_up}.get
    assert stamps.shared({0, 1}) is None  # partition 1's writes must stay at its fence
    with stamps.writing(1):
        assert stamps() <= int(given_up * 1_000_000) + 1
    assert stamps.shared({0, 2}) is not None  # 2 was never held: no fence


def test_writes_are_packed_by_cassandra_partition_into_few_requests() -> None:
    from celery_scheduler.store.packing import (
        PACK_BYTES,
        PACK_PARTITIONS,
        PACK_STATEMENTS,
        Write,
        packed,
    )

    # a release of 60 tasks of one bucket: 60 schedule rows and 60 statuses of one slot,
    # written for 3 Kafka partitions, interleaved as the store lists them
    writes = [Write(i % 3, (table, b"bucket"), 40, f"{table}-{i}")
              for i in range(60) for table in ("schedule", "key_status")]
    requests = packed(writes)
    assert len(requests) == 2  # 120 writes of 40 bytes: PACK_BYTES decides
    assert sorted(w.statement for r in requests for w in r) == sorted(w.statement for w in writes)
    assert [w.target[0] for w in requests[0][:60]] == ["schedule"] * 60  # one partition together
    assert len({w.partition for w in requests[0]}) == 3  # Kafka partitions share a request

    # many small Cassandra partitions: at most PACK_PARTITIONS a request
    scattered = [Write(0, ("key_status", bytes([i])), 20, i) for i in range(25)]
    assert [len(r) for r in packed(scattered)] == [PACK_PARTITIONS, PACK_PARTITIONS, 5]
    # weightless writes of one partition: at most PACK_STATEMENTS a request
    light = [Write(0, ("schedule_buckets", b"p"), 0, i) for i in range(PACK_STATEMENTS + 1)]
    assert [len(r) for r in packed(light)] == [PACK_STATEMENTS, 1]
    # a heavy write goes alone, the others around it keep their order
    heavy = Write(1, ("schedule", b"other"), PACK_BYTES, "heavy")
    assert packed([scattered[0], heavy, scattered[1]]) == [[heavy], [scattered[0], scattered[1]]]
    # one partition's writes heavier together than PACK_BYTES: requests of their own, which
    # Cassandra does not count against its batch size limits
    bucket = [Write(0, ("schedule", b"b"), 400, i) for i in range(60)]
    requests = packed(scattered[:2] + bucket)
    assert [len(r) for r in requests] == [len(bucket), 2]
    assert requests[0] == bucket


def test_a_writes_weight_bounds_what_cassandra_counts_for_its_batch_size() -> None:
    from celery_scheduler.store.packing import weight_of

    # a pending status: 14 values, 30 bytes of text; Cassandra counted up to 275 bytes
    pending = (3, 7, None, "order-42", "u7", "pending", "bench.record", 3, 100, 0, None, None,
               0, None)
    assert len(pending) == 14 and weight_of(pending) >= 275
    assert weight_of((b"x" * 300,)) >= 300
