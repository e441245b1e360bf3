"""Dead-letter queue: a one-off job that failed for good is announced on ``DLQ_QUEUE``
(:mod:`cron_at_scale.broker.dlq`). A recurring job's failed run is recorded, not announced: its
next occurrence fires as scheduled."""

from __future__ import annotations

from cron_at_scale.broker import dlq
from cron_at_scale.ops import metrics
from cron_at_scale.worker.middleware.base import Middleware, Run


class DeadLetter(Middleware):
    def after_failure(self, run: Run, exc: Exception) -> None:
        if run.outcome == "failed" and run.ctx is not None and run.ctx.schedule_type == "once":
            dlq.announce(run.task.app, run.ctx.job_id, run.attempt, run.task.name, run.error)
            metrics.observe_dead_lettered()
