"""The tests' OpenTelemetry set-up: one SDK tracer provider for the whole test process
(OpenTelemetry lets a process set its global provider once), exporting to memory."""

from __future__ import annotations

import functools

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

__all__ = ["exporter"]


@functools.cache
def exporter() -> InMemorySpanExporter:
    """The exporter every span of this process reaches (set up on first use)."""
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    trace.set_tracer_provider(provider)
    return spans
