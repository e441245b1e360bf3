"""Idempotent start: one statement starts the attempt, or says this message is not to run."""

from __future__ import annotations

import logging

from .base import Middleware, Run, SkipJob

log = logging.getLogger(__name__)


class IdempotentStart(Middleware):
    """Starts the message's attempt through the process's completer (``start_attempt``, which also
    writes the completions handed over since the last start). A redelivered message (its attempt
    already started) or a superseded one starts nothing and is skipped. A message whose attempt was
    reaped while it waited in the queue runs the attempt that fired the job again. A message that
    waited past its job's ``expires`` starts nothing: the statement records it skipped (expired)."""

    def __init__(self, completer):
        self.completer = completer

    def before_run(self, run: Run) -> None:
        run.job_id, run.attempt = str(run.meta["job_id"]), int(run.meta["attempt"])
        row = self.completer.start(run.job_id, run.attempt, run.worker)
        if row is None:
            log.info("skipping job %s attempt %d: already started or superseded", run.job_id, run.attempt)
            raise SkipJob()
        if row.attempt != run.attempt:
            log.info("job %s: message of attempt %d (lease ran out in the queue) runs attempt %d",
                     run.job_id, run.attempt, row.attempt)
            run.attempt = row.attempt
        if row.outcome == "skipped" and row.error.startswith("expired"):  # options["expires"], cron_at_scale.expiry
            log.warning("not running job %s attempt %d: %s", run.job_id, row.attempt, row.error)
            raise SkipJob()
        run.row = row
