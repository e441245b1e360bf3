"""Retry policy: a failed run is retried with backoff (a database state, never a Celery ETA
message) or fails for good, as the job's and the task's retry options say (:mod:`cron_at_scale.policy.retry`)."""

from __future__ import annotations

import logging
import traceback as tb

from cron_at_scale import conf
from cron_at_scale.policy import retry
from cron_at_scale.worker import attempts
from cron_at_scale.worker.middleware.base import Middleware, Run

log = logging.getLogger(__name__)


class ScheduledRetry(Exception):
    """Raised by ``JobTask.retry`` inside a scheduled run: retry as a database state."""

    def __init__(self, exc: BaseException | None, call: retry.RetryCall):
        super().__init__(str(exc) if exc else "retry requested")
        self.exc = exc
        self.call = call


class RetryPolicy(Middleware):
    """Writes a failed attempt: ``retry_attempt`` (a one-off job back to pending after its
    backoff) or ``finish_attempt`` (failed). Sets ``run.outcome`` to ``retried`` or ``failed``."""

    def after_failure(self, run: Run, exc: Exception) -> None:
        ctx = run.ctx
        assert ctx is not None
        call, cause = (exc.call, exc.exc or exc) if isinstance(exc, ScheduledRetry) else (None, exc)
        run.error = f"{type(cause).__module__}.{type(cause).__qualname__}: {cause}"[:2000]
        trace = "".join(tb.format_exception(cause))[-20000:]
        params = {"job_id": run.job_id, "attempt": run.attempt, "error": run.error, "traceback": trace}
        decision = retry.decide(run.task, cause, ctx.retries, ctx.max_retries, call=call, job_options=ctx.options,
                                retry_all=bool(conf.get("RETRY_ALL_EXCEPTIONS")))
        if ctx.schedule_type == "once" and decision.retry:
            attempts.write_retry(params, decision.delay)
            log.info("job %s attempt %d failed (%s); retry in %.1fs", run.job_id, run.attempt, run.error,
                     decision.delay)
            run.outcome = "retried"
        else:
            attempts.write_failure(params)
            run.outcome = "failed"
