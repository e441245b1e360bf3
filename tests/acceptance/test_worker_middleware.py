"""The run's span (cron_at_scale.worker.middleware.tracing) across a real ``celery worker``: the
scheduling spans come from the test's own SDK (the in-memory exporter), the worker's spans from
its JSON-lines exporter (acceptance/otel_worker.py). A short delay is the scheduling span's child;
a long delay, a retry and every cron fire start their own trace with a link to it."""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path

import pytest
from demo.runner import wait_for_workers
from django.db import transaction
from helpers import wait_until
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import cron_at_scale
from cron_at_scale.models import Job, JobAttempt
from cron_at_scale.ops import tracing

pytestmark = pytest.mark.acceptance

TESTS = Path(__file__).resolve().parents[1]
MAX_DELAY = 2.0  # TRACE_CHILD_MAX_DELAY in the worker: a countdown of 4 s is a long delay


@pytest.fixture
def tracer():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test"), exporter


def start(system, tmp_path: Path, *, instrument_celery: bool = False) -> Path:
    spans = tmp_path / "worker-spans.jsonl"
    system.env.update(
        OTEL_SPANS_FILE=str(spans),
        OTEL_CELERY_INSTRUMENT="1" if instrument_celery else "0",
        PYTHONPATH=os.pathsep.join([str(TESTS), system.env["PYTHONPATH"]]),
        CRON_AT_SCALE_SETTINGS=json.dumps({"TRACE_CHILD_MAX_DELAY": MAX_DELAY}),
    )
    system.worker("w1", extra=["--include", "acceptance.otel_worker"])
    system.dispatcher("d1")
    wait_for_workers(system.app, ["w1"])
    return spans


def worker_spans(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def runs(path: Path, job: Job) -> list[dict]:
    """The run spans of ``job``, by attempt."""
    got = [s for s in worker_spans(path) if s["attributes"].get(tracing.ATTR_JOB_ID) == str(job.id)]
    return sorted(got, key=lambda s: (s["attributes"][tracing.ATTR_ATTEMPT], s["start"]))


def ids(span) -> tuple[str, str]:
    """A test-side span's (trace id, span id) in hex, as the worker's file writes them."""
    ctx = span.get_span_context()
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


def links_to(run: dict, span) -> list[dict]:
    trace_id, span_id = ids(span)
    return [ln for ln in run["links"] if (ln["trace_id"], ln["span_id"]) == (trace_id, span_id)]


def assert_child(run: dict, span) -> None:
    trace_id, span_id = ids(span)
    assert (run["trace_id"], run["parent_span_id"]) == (trace_id, span_id), run
    assert not links_to(run, span) and run["attributes"][tracing.ATTR_RELATION] == "child"


def assert_linked(run: dict, span, reason: str) -> None:
    trace_id, _ = ids(span)
    assert run["trace_id"] != trace_id, run  # its own trace
    (link,) = links_to(run, span)
    assert link["attributes"][tracing.LINK_KIND] == "scheduled"
    assert run["attributes"][tracing.ATTR_RELATION] == "link" and run["attributes"][tracing.ATTR_REASON] == reason


def draw(scheduling: list, worker: list[dict]) -> str:
    """The spans as text trees, one per trace, links shown under the span that holds them."""
    spans = [{"name": s.name, "trace_id": ids(s)[0], "span_id": ids(s)[1],
              "parent_span_id": f"{s.parent.span_id:016x}" if s.parent else None, "attributes": {}, "links": []}
             for s in scheduling] + worker
    names = {s["span_id"]: s["name"] for s in spans}
    known = set(names)
    out: list[str] = []

    def label(s: dict) -> str:
        a = s["attributes"]
        extra = ""
        if tracing.ATTR_ATTEMPT in a:
            extra = (f"  attempt={a[tracing.ATTR_ATTEMPT]} fire_at={a[tracing.ATTR_FIRE_AT]} "
                     f"lateness={a[tracing.ATTR_LATENESS]:.3f}s queue={a[tracing.ATTR_QUEUE]} "
                     f"{a[tracing.ATTR_RELATION]}/{a[tracing.ATTR_REASON]} outcome={a.get(tracing.ATTR_OUTCOME)}")
        return f"{s['name']} [span {s['span_id'][:8]}]{extra}"

    def walk(s: dict, prefix: str, last: bool, root: bool) -> None:
        out.append(("" if root else prefix + ("└── " if last else "├── ")) + label(s))
        inner = prefix if root else prefix + ("    " if last else "│   ")
        for ln in s["links"]:
            out.append(f"{inner}  ⤷ link ({ln['attributes'].get(tracing.LINK_KIND)}) to "
                       f"{names.get(ln['span_id'], '?')} [trace {ln['trace_id'][:8]}, span {ln['span_id'][:8]}]")
        kids = [c for c in spans if c["parent_span_id"] == s["span_id"]]
        for i, c in enumerate(kids):
            walk(c, inner, i == len(kids) - 1, False)

    for s in spans:
        if s["parent_span_id"] is None or s["parent_span_id"] not in known:
            out.append(f"trace {s['trace_id'][:8]}")
            walk(s, "", True, True)
    return "\n".join(out)


def test_short_delay_is_a_child_long_delay_retry_and_cron_fire_link(system, tmp_path, tracer):
    tracer, exporter = tracer
    path = start(system, tmp_path)
    with tracer.start_as_current_span("schedule short") as short_span:
        short = cron_at_scale.schedule("demo.tasks.record")
    with tracer.start_as_current_span("schedule long") as long_span:
        late = cron_at_scale.schedule("demo.tasks.record", countdown=2 * MAX_DELAY)
    with tracer.start_as_current_span("schedule retried") as retry_span:
        retried = cron_at_scale.schedule("demo.tasks.fail", kwargs={"times": 1}, retry_backoff=1, retry_jitter=False)
    with tracer.start_as_current_span("schedule cron") as cron_span:
        cron = cron_at_scale.schedule("demo.tasks.record", cron="* * * * * *")
    with tracer.start_as_current_span("request") as request_span, transaction.atomic():
        in_tx = cron_at_scale.schedule("demo.tasks.record")  # the caller's transaction
        bulk = cron_at_scale.schedule_many([{"task": "demo.tasks.record"}, {"task": "demo.tasks.record"}])
    untraced = cron_at_scale.schedule("demo.tasks.record")

    def ran() -> bool:
        return (all(len(runs(path, j)) == 1 for j in [short, late, in_tx, *bulk, untraced])
                and len(runs(path, retried)) == 2 and len(runs(path, cron)) >= 2)

    wait_until(ran, timeout=60, what="every run's span")
    cron_at_scale.cancel(cron.id)

    # stored at scheduling, from the span current there; nothing without one
    assert Job.objects.get(id=short.id).trace_context["traceparent"].split("-")[1:3] == list(ids(short_span))
    assert Job.objects.get(id=untraced.id).trace_context is None

    (run,) = runs(path, short)
    assert_child(run, short_span)
    a = run["attributes"]
    attempt = JobAttempt.objects.get(job_id=short.id, attempt=1)
    assert a[tracing.ATTR_ATTEMPT] == 1 and a[tracing.ATTR_TASK] == "demo.tasks.record"
    assert datetime.fromisoformat(a[tracing.ATTR_FIRE_AT]) == attempt.scheduled_at
    assert a[tracing.ATTR_LATENESS] == pytest.approx((attempt.started_at - attempt.scheduled_at).total_seconds(),
                                                     abs=1e-6)
    assert a[tracing.ATTR_QUEUE] == "celery" and a[tracing.ATTR_OUTCOME] == "succeeded"

    (run,) = runs(path, late)
    assert_linked(run, long_span, "delay")
    assert run["parent_span_id"] is None

    first, second = runs(path, retried)
    assert_child(first, retry_span)  # the first attempt, due at once
    assert first["attributes"][tracing.ATTR_OUTCOME] == "retried" and "exception" in first["events"]
    assert_linked(second, retry_span, "retry")
    assert second["attributes"][tracing.ATTR_ATTEMPT] == 2
    assert second["attributes"][tracing.ATTR_OUTCOME] == "succeeded"

    fires = runs(path, cron)
    for fire in fires:
        assert_linked(fire, cron_span, "recurring")
    assert len({f["trace_id"] for f in fires}) == len(fires)  # a trace per fire

    for job in [in_tx, *bulk]:
        (run,) = runs(path, job)
        assert_child(run, request_span)

    (run,) = runs(path, untraced)
    assert run["parent_span_id"] is None and not run["links"] and run["attributes"][tracing.ATTR_RELATION] == "none"

    shown = [*runs(path, short), *runs(path, late), *runs(path, retried), *fires[:2]]
    print(draw([s for s in exporter.get_finished_spans() if s.name != "request"], shown))


def test_beside_celerys_instrumentation_a_run_keeps_its_place(system, tmp_path, tracer):
    tracer, exporter = tracer
    path = start(system, tmp_path, instrument_celery=True)
    with tracer.start_as_current_span("schedule short") as short_span:
        short = cron_at_scale.schedule("demo.tasks.record")
    with tracer.start_as_current_span("schedule long") as long_span:
        late = cron_at_scale.schedule("demo.tasks.record", countdown=2 * MAX_DELAY)
    wait_until(lambda: len(runs(path, short)) == 1 and len(runs(path, late)) == 1, timeout=60, what="both runs")
    wait_until(lambda: len([s for s in worker_spans(path) if s["name"] == "run/demo.tasks.record"]) == 2,
               timeout=10, what="Celery's spans of both runs")
    celery = {s["span_id"]: s for s in worker_spans(path) if s["name"] == "run/demo.tasks.record"}

    (run,) = runs(path, short)
    assert_child(run, short_span)  # in the scheduling trace; Celery's span linked
    (link,) = [ln for ln in run["links"] if ln["attributes"][tracing.LINK_KIND] == "celery"]
    assert link["span_id"] in celery

    (run,) = runs(path, late)
    assert_linked(run, long_span, "delay")
    assert run["parent_span_id"] in celery  # a new trace: Celery's span, then the run's
    assert celery[run["parent_span_id"]]["trace_id"] == run["trace_id"]
    wait_until(lambda: Job.objects.filter(id__in=[short.id, late.id], status="completed").count() == 2,
               timeout=10, what="both jobs completed")  # the instrumentation broke nothing
    print(draw(list(exporter.get_finished_spans()), worker_spans(path)))
