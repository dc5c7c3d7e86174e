"""OpenTelemetry traces (celery_scheduler.tracing): what a schedule call carries, and the
span a worker makes of a release. The real path (Kafka, Cassandra, a dispatcher, a worker)
is in tests/integration/test_tracing.py."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from celery_scheduler import tracing
from celery_scheduler.config import get_settings
from celery_scheduler.keys import TaskKey
from celery_scheduler.wire import HEADER, Release
from tests.tracing import exporter

DUE_MS = 1_900_000_000_000
EXPORTER = exporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    EXPORTER.clear()
    yield EXPORTER
    EXPORTER.clear()


def app_with(on: bool) -> Celery:
    app = Celery(f"tracing-{on}", set_as_current=False)
    app.conf.scheduler_opentelemetry = on
    return app


def test_a_call_made_in_a_span_carries_its_context_and_the_callers_own_header_wins(
        spans: InMemorySpanExporter) -> None:
    settings = get_settings(app_with(True))
    assert tracing.traced_options({"queue": "q"}, settings) == {"queue": "q"}  # no span: nothing
    with trace.get_tracer("test").start_as_current_span("checkout") as span:
        options = tracing.traced_options({"queue": "q", "headers": {"x": "1"}}, settings)
        own = tracing.traced_options({"headers": {"traceparent": "mine"}}, settings)
    trace_id = format(span.get_span_context().trace_id, "032x")
    assert options["queue"] == "q" and options["headers"]["x"] == "1"
    assert options["headers"]["traceparent"].split("-")[1] == trace_id
    # a copy of its own, which a tracer that rewrites traceparent at a publish leaves alone
    assert options["headers"][tracing.TRACE_HEADER] == {"traceparent": options["headers"]["traceparent"]}
    assert own["headers"]["traceparent"] == "mine"
    with trace.get_tracer("test").start_as_current_span("checkout"):  # left for check_options
        assert tracing.traced_options({"headers": ["x"]}, settings) == {"headers": ["x"]}


def test_with_tracing_off_a_call_carries_nothing(spans: InMemorySpanExporter) -> None:
    settings = get_settings(app_with(False))
    with trace.get_tracer("test").start_as_current_span("checkout"):
        assert tracing.traced_options({"queue": "q"}, settings) == {"queue": "q"}


def released_task(app: Celery, parent: dict[str, Any], marked_ms: int = DUE_MS + 40) -> Any:
    """A task as a worker holds it: its request's headers are its attributes."""
    release = Release(TaskKey("customer-42", DUE_MS, "trial-ends"), 3, 2, 1, DUE_MS + 8000,
                      DUE_MS, 20_000, marked_ms)
    request = SimpleNamespace(**{HEADER: release.header(), **parent})
    return SimpleNamespace(name="proj.remind", request=request, _get_app=lambda: app)


def _run(task: Any, state: str, retval: Any = None) -> ReadableSpan:
    tracing._on_prerun(task=task)
    tracing._on_postrun(task=task, state=state, retval=retval)
    assert getattr(task.request, tracing.SPAN_ATTRIBUTE) is None  # not kept past the run
    return EXPORTER.get_finished_spans()[-1]


def test_a_run_is_a_child_of_the_schedule_calls_span_with_its_lateness(
        spans: InMemorySpanExporter) -> None:
    with trace.get_tracer("test").start_as_current_span("checkout") as parent:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
    with trace.get_tracer("test").start_as_current_span("publish") as publish:
        rewritten: dict[str, str] = {}
        propagate.inject(rewritten)  # what an instrumented publish in a dispatcher sets
    headers = {**rewritten, tracing.TRACE_HEADER: carrier}
    span = _run(released_task(app_with(True), headers), "SUCCESS")
    assert publish.get_span_context().trace_id != parent.get_span_context().trace_id
    assert span.name == "celery_scheduler.run proj.remind"
    assert span.parent is not None and span.parent.span_id == parent.get_span_context().span_id
    assert span.context.trace_id == parent.get_span_context().trace_id
    a = span.attributes or {}
    assert a["celery_scheduler.task_key"] == "customer-42@2030-03-17T17:46:40+00:00#trial-ends"
    assert (a["celery_scheduler.ordering_id"], a["celery_scheduler.attempt"],
            a["celery_scheduler.partition"]) == ("customer-42", 2, 3)
    assert a["celery_scheduler.scheduled_at_ms"] == DUE_MS
    assert a["celery_scheduler.released_at_ms"] == DUE_MS + 40
    assert a["celery_scheduler.release_lateness_ms"] == 40
    started, finished = a["celery_scheduler.started_at_ms"], a["celery_scheduler.finished_at_ms"]
    assert isinstance(started, int) and isinstance(finished, int) and started <= finished
    assert a["celery_scheduler.start_lateness_ms"] == started - DUE_MS
    assert a["celery.state"] == "SUCCESS"
    assert span.status.status_code is trace.StatusCode.UNSET


def test_a_failed_run_is_an_error_span_with_its_exception(spans: InMemorySpanExporter) -> None:
    span = _run(released_task(app_with(True), {}), "FAILURE", ValueError("card declined"))
    assert span.status.status_code is trace.StatusCode.ERROR
    assert span.status.description == "ValueError: card declined"
    assert [event.name for event in span.events] == ["exception"]
    assert span.parent is None  # a call made in no span: the run starts its own trace


def test_a_release_without_the_packages_header_joins_the_trace_of_its_traceparent(
        spans: InMemorySpanExporter) -> None:
    with trace.get_tracer("test").start_as_current_span("checkout") as parent:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
    span = _run(released_task(app_with(True), carrier), "SUCCESS")
    assert span.context.trace_id == parent.get_span_context().trace_id


def test_no_span_with_tracing_off_or_for_a_task_that_was_not_released(
        spans: InMemorySpanExporter) -> None:
    _run_quietly = [released_task(app_with(False), {}),
                    SimpleNamespace(name="plain", request=SimpleNamespace(),
                                    _get_app=lambda: app_with(True))]
    for task in _run_quietly:
        tracing._on_prerun(task=task)
        tracing._on_postrun(task=task, state="SUCCESS")
    assert spans.get_finished_spans() == ()


def test_schedule_calls_and_batches_made_in_a_span_carry_it_to_their_records(
        spans: InMemorySpanExporter) -> None:
    from celery_scheduler import scheduled_task
    from celery_scheduler.testing import scheduler_testing

    app = app_with(True)

    @scheduled_task(ordering_id="customer")
    @app.task(name="tracing.remind")
    def remind(customer: str) -> None:
        return None

    due = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)
    with scheduler_testing(app, start=due - dt.timedelta(hours=1)) as testing:
        remind.schedule_at(due, "outside")  # no span: no trace to carry
        with trace.get_tracer("test").start_as_current_span("signup") as span:
            remind.schedule_at(due, "ada")
            remind.schedule_many([(due, ("bob",)), (due, ("cy",))])
        carried = {e.args[0]: (e.options.get("headers") or {}).get(tracing.TRACE_HEADER)
                   for e in testing.pending()}
    trace_id = format(span.get_span_context().trace_id, "032x")
    assert carried["outside"] is None
    for customer in ("ada", "bob", "cy"):
        assert carried[customer]["traceparent"].split("-")[1] == trace_id


def test_the_dispatcher_records_a_persist_and_each_release_in_the_callers_trace(
        spans: InMemorySpanExporter) -> None:
    from celery_scheduler.envelope import ScheduleEnvelope

    settings = get_settings(app_with(True))
    with trace.get_tracer("test").start_as_current_span("checkout") as checkout:
        options = dict(tracing.traced_options({"queue": "q"}, settings))
    key = TaskKey("ada", DUE_MS, "u")
    traced = ScheduleEnvelope(key, "shop.remind", ["ada"], options=options)
    untraced = ScheduleEnvelope(TaskKey("bob", DUE_MS, "u"), "shop.remind", ["bob"])
    spans.clear()
    dispatcher = tracing.DispatcherSpans(enabled=True)
    dispatcher.persisted([(traced, 3), (untraced, 3)], DUE_MS - 60_000, DUE_MS - 59_990)
    first = Release(key, 3, 1, 1, DUE_MS + 8000, marked_ms=DUE_MS + 2)
    second = Release(key, 3, 2, 1, DUE_MS + 20_000, marked_ms=DUE_MS + 9000)
    dispatcher.released([(traced, first, None), (untraced, first, None)], DUE_MS + 3, DUE_MS + 4)
    dispatcher.released([(traced, second, ConnectionError("broker down"))], DUE_MS + 9001, DUE_MS + 9002)
    persist, released, failed = spans.get_finished_spans()
    parent = checkout.get_span_context()
    for span in (persist, released, failed):
        assert span.context.trace_id == parent.trace_id and span.parent.span_id == parent.span_id
        assert span.attributes["celery_scheduler.task_key"] == str(key)
    assert persist.name == "celery_scheduler.persist shop.remind"
    assert (persist.start_time, persist.end_time) == ((DUE_MS - 60_000) * 10**6, (DUE_MS - 59_990) * 10**6)
    assert released.name == "celery_scheduler.release shop.remind"
    assert released.attributes["celery_scheduler.release_lateness_ms"] == 2
    assert failed.attributes["celery_scheduler.attempt"] == 2
    assert failed.status.status_code is trace.StatusCode.ERROR and "broker down" in failed.status.description


def test_with_tracing_off_the_dispatcher_records_nothing(spans: InMemorySpanExporter) -> None:
    from celery_scheduler.envelope import ScheduleEnvelope

    settings = get_settings(app_with(True))
    with trace.get_tracer("test").start_as_current_span("checkout"):
        options = dict(tracing.traced_options({}, settings))
    traced = ScheduleEnvelope(TaskKey("ada", DUE_MS, "u"), "shop.remind", [], options=options)
    spans.clear()
    off = tracing.DispatcherSpans(enabled=False)
    off.persisted([(traced, 0)], DUE_MS, DUE_MS)
    off.released([(traced, Release(traced.key, 0, 1, 1), None)], DUE_MS, DUE_MS)
    assert spans.get_finished_spans() == ()
