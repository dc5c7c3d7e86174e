"""Scenario 3k: delivery lateness of delayed Kafka messages (``schedule_message``) at 100/s.

One dispatcher and no Celery workers: each message is produced by the dispatcher to a
target topic when due, and a reader in this process notes when it arrived. Lateness = the
arrival in the reader minus the due time (end to end), split at the message's Kafka
timestamp (when the dispatcher produced it).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from benchmarks.context import Context, feed, utc
from benchmarks.cpu import CpuMeter, CpuUse, add_rows, local_services
from benchmarks.harness import KAFKA, Stack, log, stack
from benchmarks.report import Section
from benchmarks.stats import Figure, percentile

__all__ = ["run"]

ORDERING_IDS = 1000
RATE = 100.0


@dataclass(frozen=True)
class Outcome:
    total: int  # messages scheduled
    lateness: list[float]  # seconds, due to arrival, per message that arrived
    produced: list[float]  # due to the Kafka timestamp
    read: list[float]  # Kafka timestamp to arrival
    duplicates: int
    cpu: CpuUse


@contextmanager
def _target(name: str) -> Iterator[str]:
    admin = AdminClient({"bootstrap.servers": KAFKA})
    topic = f"{name}_delivered"
    admin.create_topics([NewTopic(topic, num_partitions=12, replication_factor=1)])[topic].result(60)
    try:
        yield topic
    finally:
        admin.delete_topics([topic])[topic].result(60)


class _Reader:
    """Reads the target topic from its start in a thread; notes each message's arrival."""

    def __init__(self, topic: str) -> None:
        self.arrivals: dict[int, tuple[float, float, float]] = {}  # seq -> (due, produced, arrived)
        self.duplicates = 0
        self._stop = threading.Event()
        self._consumer = Consumer({"bootstrap.servers": KAFKA, "group.id": f"{topic}-reader",
                                   "enable.auto.commit": False, "fetch.wait.max.ms": 5})
        self._consumer.assign([TopicPartition(topic, p, 0) for p in range(12)])
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            message = self._consumer.poll(0.05)
            if message is None or message.error() is not None:
                continue
            arrived = time.time()
            body = json.loads(message.value() or b"{}")
            if body["seq"] in self.arrivals:
                self.duplicates += 1
                continue
            self.arrivals[body["seq"]] = (body["due"], message.timestamp()[1] / 1000, arrived)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()


def _measure(ctx: Context, s: Stack, topic: str, duration: float, lead: float) -> Outcome:
    from celery_scheduler import flush, schedule_message

    app = s.use_client()
    reader = _Reader(topic)
    meter = CpuMeter({"dispatcher": [p.pid for p in s.processes], "load generator": [os.getpid()],
                      **local_services()}, alone=["load generator"])
    meter.start()

    def publish(seq: int, due: float) -> None:
        schedule_message(topic, json.dumps({"seq": seq, "due": due}).encode(),
                         key=f"o{seq % ORDERING_IDS}".encode(), at=utc(due),
                         ordering_id=f"o{seq % ORDERING_IDS}", app=app.app, wait=False)

    t0, total, _ = feed(publish, RATE, duration, lead)
    flush(app.app, 60)
    deadline = t0 + duration + ctx.pick(6, 15)
    while time.time() < deadline and len(reader.arrivals) < total:
        s.check_alive()
        time.sleep(0.2)
    cpu = meter.stop()
    reader.close()
    arrivals = list(reader.arrivals.values())
    log(f"delivery at {RATE:g}/s: {len(arrivals)} of {total} arrived")
    return Outcome(total, [a - d for d, _, a in arrivals], [p - d for d, p, _ in arrivals],
                   [a - p for _, p, a in arrivals], reader.duplicates, cpu)


def run(ctx: Context) -> list[Section]:
    section = Section("3k", f"Delayed Kafka messages: delivery lateness at {RATE:g} due messages/s")
    duration, lead = ctx.pick(2, 20), ctx.pick(2, 5)
    outcomes: list[Outcome] = []
    try:
        with stack(ctx.tmp) as s:
            s.dispatcher()
            for number in range(ctx.pick(1, 3)):
                # a topic per run: a reader reads its topic from the start, and messages
                # of an earlier run, with the same numbers, would count as this run's
                with _target(f"{s.name}_{number}") as topic:
                    outcomes.append(_measure(ctx, s, topic, duration, lead))
    except Exception as exc:
        section.error = f"{type(exc).__name__}: {exc}"[:500]
    if outcomes:
        for name, label in (("lateness", "due to read from the target topic"),
                            ("produced", "of which due to produced by the dispatcher"),
                            ("read", "of which produced to read")):
            for q in (50, 99):
                figure = Figure.of([percentile(getattr(o, name), q) * 1000 for o in outcomes
                                    if getattr(o, name)], "ms", 1)
                targeted = name == "lateness" and q == 99
                section.add(f"{label}, p{q}", figure, "≤ 20 ms" if targeted else "",
                            figure.median <= 20 if targeted else None)
        section.add("messages delivered by the deadline",
                    Figure.of([len(o.lateness) / o.total for o in outcomes], "%", 1))
        section.add("messages delivered more than once", Figure.of([o.duplicates for o in outcomes]))
        add_rows(section, "celery_scheduler", [o.cpu for o in outcomes],
                 [len(o.lateness) for o in outcomes])
    section.method = [
        f"message i is due at t0 + i/{RATE:g} s and scheduled {lead:g} s before with "
        f"schedule_message(wait=False), over {ORDERING_IDS} ordering ids, to a target topic of 12 "
        "partitions; one dispatcher, no Celery workers; a reader in the load generator's process "
        "reads the target topic from its start (fetch wait 5 ms).",
        "lateness = arrival in the reader - due time; split at the message's Kafka timestamp "
        "(CreateTime: when the dispatcher's producer took it).",
        "CPU: dispatcher, load generator (which also reads) and the services, from the first "
        "schedule call to the end of the wait, per message delivered.",
    ]
    return [section]
