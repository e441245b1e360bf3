"""Idempotent start: one statement starts the attempt, or says this message is not to run (yet)."""

from __future__ import annotations

import logging
import time

from cron_at_scale import conf
from cron_at_scale.worker import batch_start
from cron_at_scale.worker.middleware.base import Middleware, Run, SkipJob

log = logging.getLogger(__name__)

EARLY_MARGIN = 1.0  # seconds a message may be early beyond ETA_LEAD before it is left to the reaper


class IdempotentStart(Middleware):
    """Starts the message's attempt through the process's completer (``start_attempt``, which also
    writes the completions handed over since the last start). A redelivered message (its attempt
    already started) or a superseded one starts nothing and is skipped. A message whose attempt was
    reaped while it waited in the queue runs the attempt that fired the job again. A message that
    waited past its job's ``expires`` starts nothing: the statement records it skipped (expired).

    A message run before its ``fire_at`` by the database clock (published ``ETA_LEAD`` ahead, held
    by a worker whose clock is ahead) is refused by the statement, which says how many seconds
    early it is: the task waits that long and starts again, as long as the waits stay within
    ``ETA_LEAD`` + 1 s (no lead could make a message earlier). Beyond that the message is skipped
    and its attempt stays ``dispatched``: its dispatch lease runs out and the reaper fires it again.

    A message the worker's main process started in a batch (``BATCH_STARTS``,
    :mod:`cron_at_scale.worker.batch_start`) carries its started row: used as it is while fresh,
    else the attempt is started again under the batch's token (confirmed still this message's).
    """

    def __init__(self, completer):
        self.completer = completer

    def before_run(self, run: Run) -> None:
        run.job_id, run.attempt = str(run.meta["job_id"]), int(run.meta["attempt"])
        started = batch_start.started_of(run.task.request)
        token = started["token"] if started is not None else None
        fire_at = run.meta.get("fire_at")  # a recurring run starts only for the occurrence it names
        try:
            if started is None:
                raise LookupError("not started in a batch")
            row = batch_start.fresh_row(started)
        except LookupError:
            row = self.completer.start(run.job_id, run.attempt, run.worker, token, fire_at)
        waited = 0.0
        while row is not None and row.outcome == "early":
            if waited + row.early_by > conf.eta_lead(conf.values()) + EARLY_MARGIN:
                log.warning("job %s attempt %d: run %.3fs before its fire_at by the database clock (the worker's "
                            "clock is ahead?); not started, the reaper fires it again", run.job_id, row.attempt,
                            row.early_by)
                raise SkipJob()
            time.sleep(row.early_by)
            waited += row.early_by
            row = self.completer.start(run.job_id, run.attempt, run.worker, token, fire_at)
        if row is None:
            log.info("skipping job %s attempt %d: already started or superseded", run.job_id, run.attempt)
            raise SkipJob()
        if row.attempt != run.attempt:
            log.info("job %s: message of attempt %d (lease ran out in the queue) runs attempt %d",
                     run.job_id, run.attempt, row.attempt)
            run.attempt = row.attempt
        if row.outcome == "skipped" and row.error.startswith("expired"):  # options["expires"], cron_at_scale.policy.expiry
            log.warning("not running job %s attempt %d: %s", run.job_id, row.attempt, row.error)
            raise SkipJob("expired")
        run.row = row
