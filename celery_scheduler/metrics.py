"""Dispatcher metrics for Prometheus (``pip install celery-scheduler[monitoring]``).

``celery -A proj scheduler dispatch --metrics-port 9808`` serves them on ``/metrics``:

====================================================  =========  ==============================
name                                                  type       meaning
====================================================  =========  ==============================
celery_scheduler_persisted_total                      counter    schedule records stored
celery_scheduler_cancelled_total                      counter    cancel records applied
celery_scheduler_rescheduled_total                    counter    tasks moved to another time
celery_scheduler_dead_letters_total                   counter    records dead-lettered
celery_scheduler_released_total                       counter    releases to Celery (retries too)
celery_scheduler_finished_total{outcome}              counter    keys succeeded / failed
celery_scheduler_retries_total                        counter    failed attempts to be retried
celery_scheduler_release_lateness_seconds             histogram  release time minus due time
celery_scheduler_loaded_tasks                         gauge      tasks held in memory
celery_scheduler_in_flight_tasks                      gauge      released, outcome not yet seen
celery_scheduler_owned_partitions                     gauge      partitions leased by this process
celery_scheduler_held_ordering_ids                    gauge      ordering ids a pause holds here
celery_scheduler_rate_limit_per_second{task}          gauge      this dispatcher's share of a limit
celery_scheduler_rate_limited_total                   counter    releases put off to a later slot
====================================================  =========  ==============================
"""

from __future__ import annotations

from typing import Any

from celery_scheduler.errors import ConfigurationError

__all__ = ["Metrics", "PrometheusMetrics", "serve"]


class Metrics:
    """Receives the dispatcher's events; this base records nothing."""

    def persisted(self, count: int = 1) -> None: ...

    def cancelled(self) -> None: ...

    def rescheduled(self) -> None: ...

    def dead_lettered(self) -> None: ...

    def released(self, lateness_seconds: float) -> None: ...

    def finished(self, outcome: str) -> None: ...

    def retried(self) -> None: ...

    def state(self, loaded: int, in_flight: int, partitions: int) -> None: ...

    def held(self, ordering_ids: int) -> None: ...

    def rate_limits(self, per_second: dict[str, float], delayed: int) -> None: ...


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise ConfigurationError(
            "metrics need prometheus-client: pip install 'celery-scheduler[monitoring]'"
        ) from None
    return prometheus_client


class PrometheusMetrics(Metrics):
    """Metrics in a Prometheus registry (the default one unless *registry* is given)."""

    def __init__(self, registry: Any = None) -> None:
        p = _prometheus()
        self.registry = registry if registry is not None else p.REGISTRY
        kw = {"registry": self.registry}
        self._persisted = p.Counter("celery_scheduler_persisted", "schedule records stored", **kw)
        self._cancelled = p.Counter("celery_scheduler_cancelled", "cancel records applied", **kw)
        self._rescheduled = p.Counter("celery_scheduler_rescheduled",
                                      "pending tasks moved to another time", **kw)
        self._dead = p.Counter("celery_scheduler_dead_letters", "records dead-lettered", **kw)
        self._released = p.Counter("celery_scheduler_released", "releases to Celery", **kw)
        self._finished = p.Counter("celery_scheduler_finished", "keys finished", ["outcome"], **kw)
        self._retries = p.Counter("celery_scheduler_retries", "failed attempts to retry", **kw)
        self._lateness = p.Histogram(
            "celery_scheduler_release_lateness_seconds", "release time minus due time",
            buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 60, 300), **kw)
        self._loaded = p.Gauge("celery_scheduler_loaded_tasks", "tasks held in memory", **kw)
        self._in_flight = p.Gauge("celery_scheduler_in_flight_tasks", "released, not finished", **kw)
        self._partitions = p.Gauge("celery_scheduler_owned_partitions", "partitions leased", **kw)
        self._held = p.Gauge("celery_scheduler_held_ordering_ids",
                             "ordering ids whose due task a pause holds", **kw)
        self._limit = p.Gauge("celery_scheduler_rate_limit_per_second",
                              "this dispatcher's share of a task name's rate limit", ["task"], **kw)
        self._delayed = p.Counter("celery_scheduler_rate_limited",
                                  "releases put off to a rate limit's next slot", **kw)
        self._delayed_seen = 0
        self._limited: set[str] = set()

    def persisted(self, count: int = 1) -> None:
        self._persisted.inc(count)

    def cancelled(self) -> None:
        self._cancelled.inc()

    def rescheduled(self) -> None:
        self._rescheduled.inc()

    def dead_lettered(self) -> None:
        self._dead.inc()

    def released(self, lateness_seconds: float) -> None:
        self._released.inc()
        self._lateness.observe(max(0.0, lateness_seconds))

    def finished(self, outcome: str) -> None:
        self._finished.labels(outcome).inc()

    def retried(self) -> None:
        self._retries.inc()

    def state(self, loaded: int, in_flight: int, partitions: int) -> None:
        self._loaded.set(loaded)
        self._in_flight.set(in_flight)
        self._partitions.set(partitions)

    def held(self, ordering_ids: int) -> None:
        self._held.set(ordering_ids)

    def rate_limits(self, per_second: dict[str, float], delayed: int) -> None:
        for task in self._limited - per_second.keys():  # lifted
            self._limit.remove(task)
        for task, rate in per_second.items():
            self._limit.labels(task).set(rate)
        self._limited = set(per_second)
        if delayed > self._delayed_seen:
            self._delayed.inc(delayed - self._delayed_seen)
        self._delayed_seen = delayed


def serve(port: int, address: str = "0.0.0.0") -> PrometheusMetrics:
    """Serve ``/metrics`` on *port* and return the metrics to record into."""
    p = _prometheus()
    metrics = PrometheusMetrics()
    p.start_http_server(port, addr=address)
    return metrics
