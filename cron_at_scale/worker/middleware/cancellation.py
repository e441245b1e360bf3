"""Cancellation: a job cancelled (or already completed) since its claim does not run.

The start statement records such an attempt as ``cancelled`` (or ``skipped``)
instead of ``running``; a cancel that arrives while the task runs reaches it
through ``current_job().cancel_requested``, refreshed by the heartbeat
(cooperative cancellation, :mod:`.lease`).
"""

from __future__ import annotations

import logging

from cron_at_scale.worker.middleware.base import Middleware, Run, SkipJob

log = logging.getLogger(__name__)


class Cancellation(Middleware):
    def before_run(self, run: Run) -> None:
        if run.row.outcome != "running":
            log.info("skipping job %s attempt %d: %s", run.job_id, run.attempt, run.row.outcome)
            raise SkipJob(run.row.outcome)  # 'cancelled' or 'skipped' (an earlier attempt succeeded)
