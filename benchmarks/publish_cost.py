"""What publishing a release to a Redis broker costs the dispatcher in CPU, by batch size.

::

    python -m benchmarks.publish_cost [--count 5000] [--batches 1,10,100]

Publishes *count* releases through the dispatcher's publisher (``release.Publisher``, as its
sender thread does) to a queue of its own on the local Redis, in steps of each batch size,
and prints the CPU time of this process per release, pushed onto Redis by the publisher
itself (``release.redis_push``) and through kombu's producer. For comparison, the same task sent
with Celery's ``apply_async`` one at a time, and the finished messages pushed with a bare
``LPUSH`` (one command a message, and one pipeline a batch). At light load a dispatcher
sends each release alone, at its due time: the figure for batch 1 is part of its CPU per
task in the benchmarks, and the bare push is what the broker's client alone costs.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import redis

from benchmarks.app import REDIS, app, plain
from celery_scheduler.envelope import ScheduleEnvelope
from celery_scheduler.keys import TaskKey
from celery_scheduler.release import Publisher
from celery_scheduler.wire import Release

__all__ = ["main"]

QUEUE = "bench-publish-cost"
ARGS = ["customer-42", 1234, 1_800_000_000.0]  # bench.plain's (ordering_id, seq, at)
CELERY_ARGS = tuple(ARGS)  # apply_async takes a tuple


def _items(count: int) -> list[tuple[ScheduleEnvelope, Release]]:
    items = []
    for n in range(count):
        key = TaskKey(f"o{n % 1000}", 1_800_000_000_000 + n, f"u{n}")
        envelope = ScheduleEnvelope(key, "bench.record", args=list(ARGS), options={"queue": QUEUE})
        items.append((envelope, Release(key, n % 12, 1, 1, 1_800_000_300_000 + n)))
    return items


def _cpu_per_call(calls: list[Callable[[], object]], per_call: int) -> float:
    """CPU seconds per item of running *calls* (each handles *per_call* items)."""
    started = time.process_time()
    for call in calls:
        call()
    return (time.process_time() - started) / (len(calls) * per_call)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.publish_cost", description=__doc__)
    parser.add_argument("--count", type=int, default=5000,
                        help="releases per figure (a multiple of every batch size)")
    parser.add_argument("--batches", default="1,10,100", help="releases a step, comma-separated")
    options = parser.parse_args(argv)
    client = redis.Redis.from_url(REDIS)
    publisher = Publisher(app)
    through_kombu = Publisher(app, redis_push=False)
    try:
        for each in (publisher, through_kombu):  # connected, the queue declared
            assert each.publish_many(_items(10)) == [None] * 10
        for batch in (int(b) for b in options.batches.split(",")):
            for name, used in (("release publish", publisher),
                               ("release publish through kombu's producer", through_kombu)):
                items = _items(options.count)
                steps = [items[i:i + batch] for i in range(0, len(items), batch)]

                def step(chunk: list[tuple[ScheduleEnvelope, Release]], used: Publisher = used
                         ) -> Callable[[], object]:
                    return lambda: used.publish_many(chunk)

                cpu = _cpu_per_call([step(chunk) for chunk in steps], batch)
                print(f"{name}, {batch} a step: {cpu * 1e6:,.0f} us CPU each", flush=True)
        count = options.count
        sent = _cpu_per_call([lambda: plain.apply_async(CELERY_ARGS, queue=QUEUE)] * count, 1)
        print(f"Celery apply_async, one at a time: {sent * 1e6:,.0f} us CPU each", flush=True)
        message = client.lindex(QUEUE, 0)
        assert message is not None
        bare = _cpu_per_call([lambda: client.lpush(QUEUE, message)] * count, 1)
        print(f"bare LPUSH of a {len(message):,}-byte message: {bare * 1e6:,.0f} us CPU each", flush=True)

        def pipelined() -> None:
            with client.pipeline(transaction=False) as pipe:
                for _ in range(100):
                    pipe.lpush(QUEUE, message)
                pipe.execute()

        piped = _cpu_per_call([pipelined] * (count // 100), 100)
        print(f"bare LPUSH, 100 a pipeline: {piped * 1e6:,.0f} us CPU each", flush=True)
    finally:
        publisher.close()
        through_kombu.close()
        client.delete(QUEUE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
