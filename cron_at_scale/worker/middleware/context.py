"""``current_job()``: the scheduled run a task is executing, in a context variable."""

from __future__ import annotations

import contextvars
import json
from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

from cron_at_scale.worker.middleware.base import Middleware, Run


@dataclass
class JobContext:
    """The scheduled run a task is executing (``current_job()``)."""

    job_id: UUID
    attempt: int
    fire_at: datetime  # the occurrence's scheduled time (aware UTC)
    schedule_type: str
    retries: int
    max_retries: int | None  # the job's own limit; None: the task's (Celery's meaning)
    cancel_requested: bool = False
    worker: str = ""
    options: dict = field(default_factory=dict, repr=False)
    occurrence: datetime | None = None  # a recurring run's nominal occurrence (fire_at without jitter)
    # The lease ran out (a stall longer than RUN_LEASE) and the job fired again: another run may
    # be doing the same work now. Refreshed by the heartbeat; a success is still recorded.
    lease_lost: bool = False


_current: contextvars.ContextVar[JobContext | None] = contextvars.ContextVar("cron_at_scale_job", default=None)


def current_job() -> JobContext | None:
    """Inside a scheduled run: its ``job_id``, ``attempt``, scheduled ``fire_at`` (when it was due),
    ``occurrence`` (a recurring run's nominal schedule time), ``cancel_requested`` and
    ``lease_lost`` (both refreshed by the heartbeat: stop, or fence your own writes with the
    attempt number, when either turns True); ``None`` outside one."""
    return _current.get()


class CurrentJob(Middleware):
    """Builds the run's :class:`JobContext` from its started attempt and sets it for the task."""

    def before_run(self, run: Run) -> None:
        row = run.row
        run.ctx = JobContext(UUID(run.job_id), run.attempt, row.scheduled_at, row.schedule_type, row.retries,
                             row.max_retries, cancel_requested=row.cancel_requested, worker=run.worker,
                             options=_json(row.options), occurrence=_occurrence(run.meta, row.scheduled_at))
        run.state["context_token"] = _current.set(run.ctx)
        run.task.request.retries = row.retries  # as Celery's own retries would show it

    def after_run(self, run: Run) -> None:
        _current.reset(run.state.pop("context_token"))


def _occurrence(meta: dict, default: datetime) -> datetime:
    try:
        return datetime.fromisoformat(meta["occurrence"])
    except (KeyError, TypeError, ValueError):
        return default


def _json(value) -> dict:
    # Django's PostgreSQL backend hands jsonb to raw cursors as text.
    return json.loads(value) if isinstance(value, str) else (value or {})
