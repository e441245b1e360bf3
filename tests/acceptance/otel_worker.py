"""Loaded into a test's ``celery worker`` (``--include acceptance.otel_worker``, tests/ on its
PYTHONPATH): OpenTelemetry's SDK, every finished span written as one JSON line to the file named
by ``OTEL_SPANS_FILE``, for the test to read (the SDK's in-memory exporter lives in one process
only). With ``OTEL_CELERY_INSTRUMENT=1`` also ``opentelemetry-instrumentation-celery``, set up in
each pool process as its documentation says (``worker_process_init``)."""

from __future__ import annotations

import json
import os

from celery.signals import worker_process_init
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


def span_dict(span) -> dict:
    """A finished SDK span as plain JSON: ids in hex, as a W3C traceparent writes them."""
    ctx = span.get_span_context()
    return {
        "name": span.name,
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_span_id": f"{span.parent.span_id:016x}" if span.parent is not None else None,
        "kind": span.kind.name,
        "start": span.start_time, "end": span.end_time,  # nanoseconds since the epoch
        "status": span.status.status_code.name,
        "attributes": dict(span.attributes or {}),
        "events": [e.name for e in span.events],
        "links": [{"trace_id": f"{ln.context.trace_id:032x}", "span_id": f"{ln.context.span_id:016x}",
                   "attributes": dict(ln.attributes or {})} for ln in span.links],
        "pid": os.getpid(),
    }


class JsonLinesExporter(SpanExporter):
    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans) -> SpanExportResult:
        lines = "".join(json.dumps(span_dict(s)) + "\n" for s in spans)
        with open(self.path, "a") as out:  # one append per batch: pool processes share the file
            out.write(lines)
        return SpanExportResult.SUCCESS


provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(os.environ["OTEL_SPANS_FILE"])))
trace.set_tracer_provider(provider)


@worker_process_init.connect(weak=False)
def _instrument_celery(**_) -> None:
    if os.environ.get("OTEL_CELERY_INSTRUMENT") == "1":
        from opentelemetry.instrumentation.celery import CeleryInstrumentor

        CeleryInstrumentor().instrument()
