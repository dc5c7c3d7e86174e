"""OpenTelemetry on the real path: a task scheduled inside a span runs, through Kafka,
Cassandra, a real dispatcher and Celery's embedded worker, as spans of the caller's trace,
one a run, a failed first attempt and its retry alike."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan

from celery_scheduler import State, scheduled_task
from celery_scheduler.config import get_settings
from celery_scheduler.environment import drop
from tests.integration.test_pytest_celery import scheduler_config
from tests.tracing import exporter
from tests.waiting import wait_until

pytest_plugins = ["celery.contrib.pytest"]
pytestmark = [pytest.mark.kafka, pytest.mark.cassandra, pytest.mark.redis]

EXPORTER = exporter()
RUN = "celery_scheduler.run tracing.charge"


@pytest.fixture
def celery_config(unique_name: str, broker_url: str, kafka_bootstrap: str,
                  cassandra_contact: str) -> Mapping[str, Any]:
    return {**scheduler_config(unique_name, broker_url, kafka_bootstrap, cassandra_contact),
            "scheduler_opentelemetry": True, "scheduler_retry_backoff": 0.5}


@pytest.fixture
def charge(celery_app: Any) -> Iterator[tuple[Any, list[int]]]:
    """A task whose first run fails and second succeeds (the scheduler retries it)."""
    runs: list[int] = []

    @scheduled_task(ordering_id="customer")
    @celery_app.task(name="tracing.charge")
    def charge(customer: str, amount: int) -> int:
        runs.append(amount)
        if len(runs) == 1:
            raise ConnectionError("payment gateway away")
        return amount

    yield charge, runs
    drop(get_settings(celery_app))


def _spans(name: str) -> list[ReadableSpan]:
    return sorted((s for s in EXPORTER.get_finished_spans() if s.name == name),
                  key=lambda s: s.start_time or 0)


def test_every_run_of_a_task_is_a_span_of_the_trace_that_scheduled_it(
        charge: tuple[Any, list[int]], celery_worker: Any, celery_scheduler_dispatcher: Any
        ) -> None:
    task, runs = charge
    EXPORTER.clear()
    due = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=1)
    with trace.get_tracer("shop").start_as_current_span("checkout") as checkout:
        handle = task.schedule_at(due, "ada", 42)
    wait_until(lambda: getattr(handle.status(), "state", None) is State.SUCCEEDED
               and len(_spans(RUN)) >= 2, 60, lambda: (handle.status(), _spans(RUN)))
    assert runs == [42, 42]
    first, second = _spans(RUN)
    parent = checkout.get_span_context()
    for span in (first, second):  # each run, the retry too, in the caller's trace
        assert span.context.trace_id == parent.trace_id
        assert span.parent is not None and span.parent.span_id == parent.span_id
        attributes = span.attributes or {}
        assert attributes["celery_scheduler.task_key"] == str(handle.key)
        assert attributes["celery_scheduler.scheduled_at_ms"] == handle.key.scheduled_ms
        # released at or after its due time (less the release-ahead), started after that
        assert attributes["celery_scheduler.released_at_ms"] >= handle.key.scheduled_ms - 1000
        assert (attributes["celery_scheduler.started_at_ms"]
                >= attributes["celery_scheduler.released_at_ms"])
    assert (first.attributes or {})["celery_scheduler.attempt"] == 1
    assert (second.attributes or {})["celery_scheduler.attempt"] == 2
    assert first.status.status_code is trace.StatusCode.ERROR
    assert "payment gateway away" in (first.status.description or "")
    assert second.status.status_code is trace.StatusCode.UNSET
    # the dispatcher's spans: the task stored once, released twice, in the same trace
    [persist] = _spans("celery_scheduler.persist tracing.charge")
    releases = _spans("celery_scheduler.release tracing.charge")
    assert [(s.attributes or {})["celery_scheduler.attempt"] for s in releases] == [1, 2]
    for span in (persist, *releases):
        assert span.context.trace_id == parent.trace_id
        assert span.parent is not None and span.parent.span_id == parent.span_id
    assert persist.end_time is not None and releases[0].start_time is not None
    assert persist.end_time <= releases[0].start_time <= (first.start_time or 0)
