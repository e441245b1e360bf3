"""Tracing: each attempt's span, parented on or linked to its ``schedule()`` call's span
(:mod:`cron_at_scale.ops.tracing`, which decides; OpenTelemetry optional: without it, nothing
runs here)."""

from __future__ import annotations

from typing import Any

from cron_at_scale import conf
from cron_at_scale.ops import tracing
from cron_at_scale.worker.middleware.base import Middleware, Run


class Tracing(Middleware):
    """Starts the run's span once its attempt started (it needs the attempt's row: scheduled
    time, creation time, stored context) and ends it after the task, with the run's outcome
    (a run skipped by a later middleware, e.g. a cancelled job: ``skipped``). ``provider``: the
    OpenTelemetry ``TracerProvider`` its spans go to; None: the global one, set by the application
    (``opentelemetry.trace.set_tracer_provider``, e.g. in Celery's ``worker_process_init``)."""

    def __init__(self, provider: Any = None) -> None:
        self.provider = provider

    def before_run(self, run: Run) -> None:
        if not tracing.ENABLED:
            return
        row = run.row
        fire_at, task = row.scheduled_at, run.task.name
        attributes = {
            tracing.ATTR_JOB_ID: run.job_id,
            tracing.ATTR_ATTEMPT: run.attempt,
            tracing.ATTR_FIRE_AT: fire_at.isoformat(),
            tracing.ATTR_LATENESS: (row.started_at - fire_at).total_seconds(),
            tracing.ATTR_TASK: task,
            tracing.ATTR_QUEUE: row.queue or _delivered_from(run.task.request),
            tracing.ATTR_SCHEDULE_TYPE: row.schedule_type,
        }
        where = tracing.relation(row.schedule_type, run.attempt, fire_at, row.created_at,
                                 float(conf.get("TRACE_CHILD_MAX_DELAY")))
        run.state["span"] = tracing.RunSpan(f"{tracing.SPAN_NAME} {task}", where, tracing.stored(row.trace_context),
                                            attributes, self.provider)

    def after_failure(self, run: Run, exc: Exception) -> None:
        span = run.state.get("span")
        if span is not None:
            span.failed(exc)

    def after_run(self, run: Run) -> None:
        span = run.state.pop("span", None)
        if span is not None:
            span.end(run.outcome or "skipped")


def _delivered_from(request: Any) -> str:
    # a job without its own queue went where the task's routing sent it
    info = getattr(request, "delivery_info", None) or {}
    return str(info.get("routing_key") or "")
