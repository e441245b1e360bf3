"""Trace context from ``schedule()`` to the run (OpenTelemetry, optional: the ``otel`` extra).

The one module that imports OpenTelemetry, once, guarded: without ``opentelemetry-api``
installed :data:`ENABLED` is False, :func:`carrier` returns None at once, nothing is stored
on a job and the worker starts no span.

* **At scheduling** (``schedule``, ``schedule_many``, inside the caller's transaction or not):
  :func:`carrier` is the span current in the caller, as W3C Trace Context
  (``{"traceparent": ..., "tracestate": ...}``, the W3C propagator of
  ``opentelemetry.trace.propagation.tracecontext``, not the globally configured one, so that
  what a job keeps is bounded and the same whatever else a process propagates), stored in the
  job's ``trace_context`` column by the same insert. No current span: NULL, nothing stored.
* **At the run** (:class:`cron_at_scale.worker.middleware.tracing.Tracing`): one span per
  attempt, ``cron_at_scale.run <task>``, whose place :func:`relation` decides from the job's
  row: the first attempt of a one-off job due at most ``TRACE_CHILD_MAX_DELAY`` seconds
  after its scheduling (its ``fire_at`` minus its ``created_at``, both the database clock) is
  the scheduling span's child; anything else (due later, a retry or re-fire: attempt > 1, a
  cron or interval fire) starts its own trace, with a span link to the stored context
  (Oban links every run; awa parents the first attempt and links retries and cron fires;
  the delay cut keeps a run an hour later from stretching its request's trace over the hour).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

try:  # the optional dependency, imported here only
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover (the tests run with it installed; without it see test_ops_tracing)
    trace = None  # type: ignore[assignment]

ENABLED = trace is not None
_PROPAGATOR = TraceContextTextMapPropagator() if ENABLED else None

CHILD, LINK = "child", "link"
# Why a run links instead of being the scheduling span's child (the span's cron_at_scale.trace.reason).
REASON_SCHEDULED, REASON_DELAY, REASON_RETRY, REASON_RECURRING = "scheduled", "delay", "retry", "recurring"
SPAN_NAME = "cron_at_scale.run"  # the run span is named "cron_at_scale.run <task name>"

# Attribute names the run span carries (times: the database clock).
ATTR_JOB_ID = "cron_at_scale.job.id"
ATTR_ATTEMPT = "cron_at_scale.job.attempt"  # 1 for the first run; the fencing token
ATTR_FIRE_AT = "cron_at_scale.job.fire_at"  # the attempt's scheduled time, ISO 8601 in UTC
ATTR_LATENESS = "cron_at_scale.job.lateness_s"  # seconds from fire_at to the attempt's start (float)
ATTR_TASK = "cron_at_scale.job.task"
ATTR_QUEUE = "cron_at_scale.job.queue"  # the Celery queue the message came from
ATTR_SCHEDULE_TYPE = "cron_at_scale.job.schedule_type"  # once, cron, interval
ATTR_OUTCOME = "cron_at_scale.job.outcome"  # succeeded, retried, failed, skipped
ATTR_RELATION = "cron_at_scale.trace.relation"  # child or link
ATTR_REASON = "cron_at_scale.trace.reason"  # scheduled, delay, retry, recurring
LINK_KIND = "cron_at_scale.link"  # on a link: "scheduled" (the schedule() call) or "celery" (Celery's span)


def carrier() -> dict[str, str] | None:
    """The span current here as W3C Trace Context, ``{"traceparent": str[, "tracestate": str]}``;
    None when OpenTelemetry is not installed or no valid span is current (nothing to store)."""
    if trace is None:
        return None
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    out: dict[str, str] = {}
    _PROPAGATOR.inject(out)  # type: ignore[union-attr]
    return out or None


def relation(schedule_type: str, attempt: int, fire_at: datetime, created_at: datetime,
             max_delay: float) -> tuple[str, str]:
    """Where a run's span goes: ``(CHILD, "scheduled")`` for the first attempt (``attempt`` 1) of
    a one-off job (``schedule_type`` ``"once"``) whose ``fire_at`` is at most ``max_delay``
    seconds after its ``created_at`` (aware datetimes; a ``fire_at`` in the past counts as no
    delay); otherwise ``(LINK, reason)``, reason ``"recurring"`` (a cron or interval fire: a recurring
    job numbers its runs' attempts on, one per fire), ``"retry"`` (a one-off job's attempt > 1: a
    retry, a re-fire after a lost lease, a requeue) or ``"delay"``."""
    if schedule_type != "once":
        return LINK, REASON_RECURRING
    if attempt > 1:
        return LINK, REASON_RETRY
    if (fire_at - created_at).total_seconds() > max_delay:
        return LINK, REASON_DELAY
    return CHILD, REASON_SCHEDULED


def stored(value: Any) -> dict[str, str] | None:
    """A job's ``trace_context`` as read back (a dict, JSON text from a raw cursor, or NULL)."""
    if isinstance(value, str):
        value = json.loads(value)
    return value if isinstance(value, dict) and value.get("traceparent") else None


class RunSpan:
    """The span of one attempt, current while the task runs (its own spans are its children).

    ``where``: :func:`relation`'s answer; ``scheduled``: the job's stored carrier (or None);
    ``attributes``: the span's attributes. A span current when it starts (Celery's, from
    ``opentelemetry-instrumentation-celery``, which starts one per task before the task) is the
    parent of a linking run and is linked from a child run (which belongs to the scheduling trace).
    ``provider``: the ``TracerProvider`` to use; None: OpenTelemetry's global one.
    """

    def __init__(self, name: str, where: tuple[str, str], scheduled: dict[str, str] | None,
                 attributes: dict[str, Any], provider: Any = None) -> None:
        kind, reason = where
        origin = _PROPAGATOR.extract(scheduled) if scheduled else None  # type: ignore[union-attr]
        origin_span = trace.get_current_span(origin).get_span_context() if origin is not None else None
        current = trace.get_current_span().get_span_context()
        links = []
        parent = None  # the current context: Celery's span, or none (a new trace)
        if kind == CHILD and origin_span is not None and origin_span.is_valid:
            parent = origin
            if current.is_valid:
                links.append(Link(current, {LINK_KIND: "celery"}))
        elif origin_span is not None and origin_span.is_valid:
            links.append(Link(origin_span, {LINK_KIND: "scheduled"}))
        attributes = {**attributes, ATTR_RELATION: kind if origin_span is not None and origin_span.is_valid
                      else "none", ATTR_REASON: reason}
        self.span = trace.get_tracer("cron_at_scale", tracer_provider=provider).start_span(
            name, context=parent, kind=SpanKind.CONSUMER, links=links, attributes=attributes)
        self.token = otel_context.attach(trace.set_span_in_context(self.span))

    def failed(self, exc: BaseException) -> None:
        self.span.record_exception(exc)

    def end(self, outcome: str) -> None:
        self.span.set_attribute(ATTR_OUTCOME, outcome)
        if outcome == "failed":
            self.span.set_status(Status(StatusCode.ERROR))
        otel_context.detach(self.token)
        self.span.end()
