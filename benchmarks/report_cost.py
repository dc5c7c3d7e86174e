"""What a worker's outcome report costs in CPU, back to back and at a steady rate.

::

    python -m benchmarks.report_cost [--rates 0,300,100] [--seconds 5]

Reports outcomes the way a worker does after each task (``celery_scheduler.worker.report``,
through the package's outcome producer) to a topic of its own on the local Kafka, and
prints the CPU time of this process (its threads, the Kafka client's too) per report.
Rate 0 reports back to back, as many as it can in the time; another rate paces the reports
with a sleep between them, as a worker's tasks come, and the pacing loop's own CPU,
measured alone at the same rate, is taken off. A worker reports once per task, so the
figure at the rate its tasks come is part of its CPU per task in the benchmarks.
"""

from __future__ import annotations

import argparse
import logging
import time
import types
import uuid

from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from benchmarks.harness import KAFKA
from celery_scheduler import worker
from celery_scheduler.config import Settings
from celery_scheduler.keys import TaskKey
from celery_scheduler.wire import HEADER, Outcome, Release, outcome_topic, parse_header

__all__ = ["main"]


def _paced(seconds: float, rate: float, call: object) -> tuple[float, int]:
    """Call *call* (None: nothing) *rate* times a second for *seconds*; CPU s and calls."""
    started_cpu, started = time.process_time(), time.monotonic()
    count = 0
    while time.monotonic() - started < seconds:
        if callable(call):
            call()
        count += 1
        if rate:
            time.sleep(1 / rate)
    return time.process_time() - started_cpu, count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report_cost", description=__doc__)
    parser.add_argument("--rates", default="0,300,100", help="reports a second; 0: back to back")
    parser.add_argument("--seconds", type=float, default=5.0, help="how long each rate runs")
    options = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    topic = f"bench-report-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": KAFKA})
    admin.create_topics([NewTopic(outcome_topic(topic), 12, 1)])[outcome_topic(topic)].result(30)
    settings = Settings(kafka_bootstrap_servers=KAFKA, kafka_topic=topic)
    producer = worker.OutcomeProducer(settings)
    release = Release(TaskKey("o1", 1_700_000_000_000, "u1"), 3, 1, 1, 0)
    request = types.SimpleNamespace(**{HEADER: release.header()})
    task = types.SimpleNamespace(request=request)
    started_ms = int(time.time() * 1000)

    def report() -> None:
        parsed = parse_header(getattr(task.request, HEADER))
        assert parsed is not None
        producer.send(Outcome(parsed.key, parsed.partition, parsed.attempt, True, None,
                                     started_ms, int(time.time() * 1000)))

    try:
        report()
        producer.flush(10)  # connected, the first request answered
        for rate in (float(r) for r in options.rates.split(",")):
            cpu, count = _paced(options.seconds, rate, report)
            left = producer.flush(10)
            pacing = _paced(options.seconds, rate, None)[0] / count if rate else 0.0
            name = "back to back" if not rate else f"at {rate:,.0f}/s"
            print(f"{name}: {count:,} reports, {(cpu / count - pacing) * 1e6:,.0f} us CPU each"
                  + (f" (pacing loop, taken off: {pacing * 1e6:,.0f} us)" if rate else "")
                  + (f"; {left} not delivered" if left else ""), flush=True)
    finally:
        producer.flush(10)
        admin.delete_topics([outcome_topic(topic)])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
