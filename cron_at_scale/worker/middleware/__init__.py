"""What runs around a scheduled task in a Celery worker, one concern per class.

The shape is dramatiq's: a base class whose hooks do nothing, subclasses
that override the hooks of their concern, run in a fixed order
(:data:`cron_at_scale.worker.MIDDLEWARE`), and an exception, :class:`SkipJob`,
that ends a message without running it. In that order:

1. :class:`~.start.IdempotentStart` starts the attempt (one statement; a
   redelivered or superseded message is skipped),
2. :class:`~.cancellation.Cancellation` skips a job cancelled, or already
   completed, since its claim,
3. :class:`~.context.CurrentJob` sets ``current_job()`` for the task,
4. :class:`~.lease.Lease` keeps the attempt's lease alive while it runs,
5. :class:`~.retry_policy.RetryPolicy` records a failure: a retry with backoff
   or a final failure,
6. :class:`~.dead_letter.DeadLetter` announces a one-off job's final failure,
7. :class:`~.completion.Completion` records the success,
8. :class:`~.metrics.Metrics` counts lags and outcomes.

``before_run`` hooks run in that order, ``after_run`` hooks in reverse (for the
ones whose ``before_run`` ran); ``after_failure`` and ``after_success`` in order.
"""

from cron_at_scale.worker.middleware.base import Middleware, Run, SkipJob
from cron_at_scale.worker.middleware.context import JobContext, current_job

__all__ = ["JobContext", "Middleware", "Run", "SkipJob", "current_job"]
