"""The worker's concerns, one middleware class per concern.

The rule: **a worker concern is a middleware** (:class:`~.base.Middleware`, dramatiq's shape: a
base class whose hooks do nothing, subclasses that override the hooks of their concern), listed
in :data:`cron_at_scale.worker.task.MIDDLEWARE`, the one place that states their order. Its hooks
are per scheduled message (``before_run`` ... ``after_run``, around the task, called by
``JobTask``) and per process (worker and pool process boot and shutdown, messages received,
tasks run or lost, called from Celery's signals by :mod:`cron_at_scale.worker.signals`). The
Celery mechanisms a concern needs are wired by :mod:`cron_at_scale.worker.signals` (a signal) or
by the task class (a request class: ``JobTask.Request``, :mod:`cron_at_scale.worker.clock`);
nothing else connects a signal. :class:`SkipJob` ends a message without running it.
"""

from cron_at_scale.worker.middleware.base import Middleware, Run, SkipJob
from cron_at_scale.worker.middleware.context import JobContext, current_job

__all__ = ["JobContext", "Middleware", "Run", "SkipJob", "current_job"]
