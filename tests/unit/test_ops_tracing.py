"""Trace context from schedule() to the run (cron_at_scale.ops.tracing): the child-or-link decision,
the stored carrier, the run span's parent and links (the SDK's in-memory exporter), and the
module with OpenTelemetry absent."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from cron_at_scale.ops import tracing

T0 = datetime(2030, 1, 1, 9, tzinfo=timezone.utc)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter


@pytest.mark.parametrize(("schedule_type", "attempt", "delay", "expected"), [
    ("once", 1, 0.0, (tracing.CHILD, "scheduled")),
    ("once", 1, 60.0, (tracing.CHILD, "scheduled")),  # the threshold itself is "soon"
    ("once", 1, -3600.0, (tracing.CHILD, "scheduled")),  # scheduled at a past time: due at once
    ("once", 1, 60.001, (tracing.LINK, "delay")),
    ("once", 1, 3600.0, (tracing.LINK, "delay")),
    ("once", 2, 0.0, (tracing.LINK, "retry")),  # a retry, however soon
    ("once", 7, 0.0, (tracing.LINK, "retry")),
    ("cron", 1, 0.0, (tracing.LINK, "recurring")),  # a cron fire, however soon
    ("interval", 1, 0.5, (tracing.LINK, "recurring")),
    ("cron", 3, 0.0, (tracing.LINK, "recurring")),  # a recurring job's later fires count attempts on
])
def test_relation_parents_only_a_first_one_off_run_due_soon(schedule_type, attempt, delay, expected):
    assert tracing.relation(schedule_type, attempt, T0 + timedelta(seconds=delay), T0, 60.0) == expected


def test_relation_with_no_threshold_always_links():
    assert tracing.relation("once", 1, T0, T0, 0.0) == (tracing.CHILD, "scheduled")  # due at its creation
    assert tracing.relation("once", 1, T0 + timedelta(milliseconds=1), T0, 0.0) == (tracing.LINK, "delay")


def test_carrier_is_the_current_span_as_w3c_trace_context(spans):
    provider, _ = spans
    assert tracing.carrier() is None  # no span current: nothing to store
    with provider.get_tracer("t").start_as_current_span("request") as span:
        got = tracing.carrier()
    ctx = span.get_span_context()
    assert got == {"traceparent": f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"}
    assert tracing.stored(got) == got and tracing.stored('{"traceparent": "00-x"}') == {"traceparent": "00-x"}
    assert tracing.stored(None) is None and tracing.stored({}) is None


def _run(provider, where, carrier):
    run = tracing.RunSpan("cron_at_scale.run t", where, carrier, {tracing.ATTR_ATTEMPT: 1}, provider)
    run.end("succeeded")


def _scheduled_then_run(spans, relation: tuple[str, str]):
    """A job scheduled under a span "request", then its run's span with ``relation``: both spans."""
    provider, exporter = spans
    with provider.get_tracer("t").start_as_current_span("request") as request:
        carrier = tracing.carrier()
    _run(provider, relation, carrier)
    (run,) = [s for s in exporter.get_finished_spans() if s.name.startswith("cron_at_scale.run")]
    return request, run


def test_a_child_run_is_the_scheduling_spans_child(spans):
    request, run = _scheduled_then_run(spans, (tracing.CHILD, "scheduled"))
    assert run.context.trace_id == request.get_span_context().trace_id
    assert run.parent.span_id == request.get_span_context().span_id
    assert not run.links
    assert run.attributes[tracing.ATTR_RELATION] == "child" and run.attributes[tracing.ATTR_OUTCOME] == "succeeded"


def test_a_linking_run_starts_its_own_trace_linked_to_the_scheduling_span(spans):
    request, run = _scheduled_then_run(spans, (tracing.LINK, "retry"))
    assert run.parent is None and run.context.trace_id != request.get_span_context().trace_id
    (link,) = run.links
    assert link.context.trace_id == request.get_span_context().trace_id
    assert link.context.span_id == request.get_span_context().span_id
    assert link.attributes[tracing.LINK_KIND] == "scheduled"
    assert run.attributes[tracing.ATTR_REASON] == "retry"


def test_beside_celerys_span_a_link_run_is_its_child_and_a_child_run_links_it(spans):
    provider, exporter = spans
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("request"):
        carrier = tracing.carrier()
    with tracer.start_as_current_span("run/demo.tasks.noop") as celery_span:  # what the instrumentation starts
        _run(provider, (tracing.CHILD, "scheduled"), carrier)
        _run(provider, (tracing.LINK, "delay"), carrier)
    child, linked = [s for s in exporter.get_finished_spans() if s.name.startswith("cron_at_scale.run")]
    assert [ln.context.span_id for ln in child.links] == [celery_span.get_span_context().span_id]
    assert linked.parent.span_id == celery_span.get_span_context().span_id
    assert [ln.attributes[tracing.LINK_KIND] for ln in linked.links] == ["scheduled"]


def test_a_run_without_a_stored_context_is_a_root_without_links(spans):
    provider, exporter = spans
    _run(provider, (tracing.CHILD, "scheduled"), None)
    (run,) = exporter.get_finished_spans()
    assert run.parent is None and not run.links and run.attributes[tracing.ATTR_RELATION] == "none"


def test_without_opentelemetry_nothing_imports_it_and_there_is_no_context_to_store():
    # A fresh interpreter where every opentelemetry import fails, as when the extra is not installed:
    # the package (API, bulk, worker middleware) imports, and only ops/tracing.py tries the import.
    code = textwrap.dedent("""
        import sys, traceback
        tried = []
        class Absent:
            def find_spec(self, name, path=None, target=None):
                if name == "opentelemetry" or name.startswith("opentelemetry."):
                    # the package's module that asked (the last of its frames on the stack)
                    tried.append([f.filename for f in traceback.extract_stack() if "cron_at_scale" in f.filename][-1:])
                    raise ImportError(name)
        sys.meta_path.insert(0, Absent())
        import django
        django.setup()
        import cron_at_scale.api.bulk, cron_at_scale.worker.task
        from cron_at_scale.ops import tracing
        assert not tracing.ENABLED and tracing.carrier() is None, tracing.ENABLED
        print(sorted({p for t in tried for p in t}))
    """)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings",
           "PYTHONPATH": f"{REPO}:{REPO / 'example_project'}:{REPO / 'tests'}"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == repr([str(REPO / "cron_at_scale" / "ops" / "tracing.py")])
