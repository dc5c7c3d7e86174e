"""OpenTelemetry traces of scheduled tasks: the schedule call and each run in one trace.

With ``scheduler_opentelemetry = True`` (and ``pip install 'celery-scheduler[opentelemetry]'``),
a schedule call carries the caller's trace context (W3C ``traceparent``, and ``tracestate``
when there is one) in the task's Celery headers, through Kafka and Cassandra to every
release of the task. The worker starts a span for each run as a child of that context, so
one trace goes from the code that scheduled the task to the end of each of its runs
(retries included), with the lateness split as attributes:

- ``celery_scheduler.scheduled_at_ms``: when the task was due;
- ``celery_scheduler.released_at_ms``: when a dispatcher marked this release;
- ``celery_scheduler.started_at_ms`` and ``celery_scheduler.finished_at_ms``;
- ``celery_scheduler.release_lateness_ms`` (released minus due) and
  ``celery_scheduler.start_lateness_ms`` (started minus due).

The dispatcher records a span when it has stored the task (``celery_scheduler.persist``,
from the start to the end of the write) and one for each release (``celery_scheduler.release``,
when it handed the task to the broker), both children of the schedule call's context, so
the trace shows where the time went between the call and the run.

The context travels in a header of the package's own (``celery_scheduler_trace``), which
the worker reads: a tracer that instruments Celery's publishing in the dispatcher's process
(``opentelemetry-instrumentation-celery``) rewrites ``traceparent`` with a span of its own
and would cut the run from the caller's trace. ``traceparent`` and ``tracestate`` are set
too, for tools that read only those. Off by default: then nothing is injected, and the
worker's hooks return at once. The tracer and propagator are OpenTelemetry's global ones,
as the application set them up.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from celery_scheduler.clock import now_ms
from celery_scheduler.config import Settings, get_settings
from celery_scheduler.errors import ConfigurationError
from celery_scheduler.wire import HEADER, Release, parse_header

if TYPE_CHECKING:
    from celery_scheduler.envelope import ScheduleEnvelope

__all__ = ["SPAN_ATTRIBUTE", "TRACER_NAME", "TRACE_HEADER", "DispatcherSpans", "install",
           "traced_options"]

TRACER_NAME = "celery_scheduler"
# The run's span, kept on the task's request from task_prerun to task_postrun.
SPAN_ATTRIBUTE = "_celery_scheduler_span"
PREFIX = "celery_scheduler."
# The Celery header that carries the schedule call's trace context (a dict of the
# propagator's fields) to every release of the task.
TRACE_HEADER = "celery_scheduler_trace"


def _otel(module: str) -> Any:
    try:
        return importlib.import_module(f"opentelemetry.{module}")
    except ImportError:
        raise ConfigurationError(
            "scheduler_opentelemetry is on, but OpenTelemetry is not installed: "
            "pip install 'celery-scheduler[opentelemetry]' (or set scheduler_opentelemetry = "
            "False)") from None


def traced_options(options: Mapping[str, Any], settings: Settings) -> Mapping[str, Any]:
    """*options* with the current trace context in their ``headers``, if tracing is on and
    a trace is current; a header the caller set itself is kept."""
    if not settings.opentelemetry or not isinstance(options.get("headers") or {}, Mapping):
        return options  # (headers that are no mapping get check_options' error, unchanged)
    carrier: dict[str, str] = {}
    _otel("propagate").inject(carrier)
    if not carrier:  # no span is current: nothing to join
        return options
    headers = {**carrier, TRACE_HEADER: carrier, **(options.get("headers") or {})}
    return {**options, "headers": headers}


def _carrier(request: Any) -> dict[str, str]:
    """The schedule call's trace context, from a task request's headers (its attributes)."""
    carried = getattr(request, TRACE_HEADER, None)
    if isinstance(carried, Mapping):
        return {str(k): v for k, v in carried.items() if isinstance(v, str)}
    found = {name: getattr(request, name, None) for name in ("traceparent", "tracestate")}
    return {name: value for name, value in found.items() if isinstance(value, str)}


def _enabled(task: Any) -> bool:
    try:
        return bool(get_settings(task._get_app()).opentelemetry)
    except Exception:  # an app whose settings do not read: its own hooks say why
        return False


def _on_prerun(task: Any = None, **_: Any) -> None:
    if task is None or not _enabled(task):
        return
    release = parse_header(getattr(task.request, HEADER, None))
    if release is None:  # not a release of a scheduled task
        return
    trace = _otel("trace")
    context = _otel("propagate").extract(_carrier(task.request))
    started_ms = now_ms()
    key = release.key
    attributes: dict[str, Any] = {
        f"{PREFIX}task_key": str(key), f"{PREFIX}ordering_id": key.ordering_id,
        f"{PREFIX}uniqueness_key": key.uniqueness_key, f"{PREFIX}attempt": release.attempt,
        f"{PREFIX}partition": release.partition, f"{PREFIX}scheduled_at_ms": key.scheduled_ms,
        f"{PREFIX}started_at_ms": started_ms,
        f"{PREFIX}start_lateness_ms": started_ms - key.scheduled_ms,
        "celery.task_name": task.name,
    }
    if release.marked_ms:
        attributes[f"{PREFIX}released_at_ms"] = release.marked_ms
        attributes[f"{PREFIX}release_lateness_ms"] = release.marked_ms - key.scheduled_ms
    span = trace.get_tracer(TRACER_NAME).start_span(
        f"celery_scheduler.run {task.name}", context=context, kind=trace.SpanKind.CONSUMER,
        attributes=attributes)
    setattr(task.request, SPAN_ATTRIBUTE, span)


def _on_postrun(task: Any = None, state: str | None = None, retval: Any = None, **_: Any) -> None:
    span = getattr(getattr(task, "request", None), SPAN_ATTRIBUTE, None)
    if span is None:
        return
    setattr(task.request, SPAN_ATTRIBUTE, None)
    trace = _otel("trace")
    span.set_attribute(f"{PREFIX}finished_at_ms", now_ms())
    if state:
        span.set_attribute("celery.state", state)
    if state == "FAILURE":
        if isinstance(retval, BaseException):
            span.record_exception(retval)
        span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(retval).__name__}: {retval}"))
    span.end()


def install() -> None:
    """Connect the worker's run spans to Celery's signals (once per process; each returns at
    once for an app without ``scheduler_opentelemetry``)."""
    from celery import signals

    signals.task_prerun.connect(_on_prerun, weak=False, dispatch_uid="celery_scheduler.trace_start")
    signals.task_postrun.connect(_on_postrun, weak=False, dispatch_uid="celery_scheduler.trace_end")


def _envelope_carrier(envelope: ScheduleEnvelope) -> dict[str, str]:
    """The schedule call's trace context, from the headers a traced call put in *envelope*."""
    headers = envelope.options.get("headers")
    carried = headers.get(TRACE_HEADER) if isinstance(headers, Mapping) else None
    if not isinstance(carried, Mapping):
        return {}
    return {str(k): v for k, v in carried.items() if isinstance(v, str)}


def _key_attributes(envelope: ScheduleEnvelope, partition: int) -> dict[str, Any]:
    key = envelope.key
    return {f"{PREFIX}task_key": str(key), f"{PREFIX}ordering_id": key.ordering_id,
            f"{PREFIX}uniqueness_key": key.uniqueness_key, f"{PREFIX}partition": partition,
            f"{PREFIX}scheduled_at_ms": key.scheduled_ms, "celery.task_name": envelope.task}


class DispatcherSpans:
    """The dispatcher's spans of traced tasks: each persist and each release, as children of
    the schedule call's context. With tracing off, or for a task scheduled outside a trace,
    it records nothing (a dictionary lookup a task)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def _span(self, name: str, envelope: ScheduleEnvelope, start_ms: int, end_ms: int,
              attributes: dict[str, Any], error: BaseException | None = None) -> None:
        carrier = _envelope_carrier(envelope)
        if not carrier:
            return
        trace = _otel("trace")
        span = trace.get_tracer(TRACER_NAME).start_span(
            f"{name} {envelope.task}", context=_otel("propagate").extract(carrier),
            kind=trace.SpanKind.INTERNAL, attributes=attributes, start_time=start_ms * 1_000_000)
        if error is not None:
            span.record_exception(error)
            span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        span.end(end_time=max(start_ms, end_ms) * 1_000_000)

    def persisted(self, stored: Sequence[tuple[ScheduleEnvelope, int]], start_ms: int, end_ms: int) -> None:
        """(envelope, partition) of each task written to the store between the two times."""
        if not self.enabled:
            return
        for envelope, partition in stored:
            self._span("celery_scheduler.persist", envelope, start_ms, end_ms,
                       _key_attributes(envelope, partition))

    def released(self, sent: Sequence[tuple[ScheduleEnvelope, Release, BaseException | None]],
                 start_ms: int, end_ms: int) -> None:
        """Each release handed to the broker between the two times, with its error if it was
        not taken (or may not have been)."""
        if not self.enabled:
            return
        for envelope, release, error in sent:
            attributes = {**_key_attributes(envelope, release.partition),
                          f"{PREFIX}attempt": release.attempt,
                          f"{PREFIX}released_at_ms": release.marked_ms or start_ms,
                          f"{PREFIX}release_lateness_ms": (release.marked_ms or start_ms)
                          - envelope.key.scheduled_ms,
                          f"{PREFIX}start_lease_until_ms": release.lease_until_ms}
            self._span("celery_scheduler.release", envelope, start_ms, end_ms, attributes, error)
