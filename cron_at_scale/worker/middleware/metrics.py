"""Metrics of scheduled runs: the firing lag at each start and each run's outcome (:mod:`cron_at_scale.ops.metrics`)."""

from __future__ import annotations

from typing import Any

from cron_at_scale.ops import metrics
from cron_at_scale.worker.middleware.base import Middleware, Run


class Metrics(Middleware):
    def before_run(self, run: Run) -> None:
        row = run.row
        # database clock on both ends; from the job's creation if it was scheduled at a past time
        metrics.observe_start((row.started_at - max(row.scheduled_at, row.created_at)).total_seconds())

    def after_failure(self, run: Run, exc: Exception) -> None:
        if run.outcome:
            metrics.observe_outcome(run.outcome)

    def after_success(self, run: Run, result: Any) -> None:
        metrics.observe_outcome("succeeded")
