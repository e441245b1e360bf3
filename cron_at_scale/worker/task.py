"""The Celery side: ``JobTask``, the task class that runs a scheduled message through the middleware.

Configure the Celery app once, so every task (also plain ``@shared_task``)
gets it::

    app = Celery("proj", task_cls="cron_at_scale.worker:JobTask")

A message the dispatcher published carries a ``cron_at_scale`` header; such a
message runs through the middleware of :data:`MIDDLEWARE` (below: the list, its
order and what each does are stated there only). Messages without the header
(``task.delay()``) run exactly as before.
"""

from __future__ import annotations

import logging
import traceback
from typing import Any

from celery import Task
from celery.utils.saferepr import saferepr
from django.db import connections

from cron_at_scale import conf
from cron_at_scale.broker.message import HEADER
from cron_at_scale.ops.identity import process_name
from cron_at_scale.policy import retry
from cron_at_scale.worker.attempts import COMPLETION_DELAY, BatchCompleter, InlineCompleter
from cron_at_scale.worker.batch_start import BatchStarts
from cron_at_scale.worker.health import WorkerHealth
from cron_at_scale.worker.lost import LostProcess
from cron_at_scale.worker.middleware import JobContext, Middleware, Run, SkipJob, current_job
from cron_at_scale.worker.middleware.base import Hooks
from cron_at_scale.worker.middleware.cancellation import Cancellation
from cron_at_scale.worker.middleware.completion import Completion
from cron_at_scale.worker.middleware.context import CurrentJob
from cron_at_scale.worker.middleware.dead_letter import DeadLetter
from cron_at_scale.worker.middleware.lease import Heartbeat, Lease, beat_on
from cron_at_scale.worker.middleware.metrics import Metrics
from cron_at_scale.worker.middleware.refuse_pickle import RefusePickle
from cron_at_scale.worker.middleware.retry_policy import RetryPolicy, ScheduledRetry
from cron_at_scale.worker.middleware.start import IdempotentStart
from cron_at_scale.worker.middleware.tracing import Tracing

log = logging.getLogger(__name__)

__all__ = ["COMPLETION_DELAY", "AttemptWriter", "JobContext", "JobTask", "MIDDLEWARE", "SkipJob", "current_job",
           "job_header", "worker_name", "writer"]


def job_header(request) -> dict | None:
    """The ``cron_at_scale`` header of a Celery request (``job_id``, ``attempt``, ``fire_at``,
    ``occurrence``), or None for a message the dispatcher did not publish."""
    if request is None:
        return None
    meta = getattr(request, HEADER, None)
    if meta is None:
        meta = (getattr(request, "headers", None) or {}).get(HEADER)
    return meta if isinstance(meta, dict) else None


worker_name = process_name  # the old name


class AttemptWriter(BatchCompleter):
    """A worker process's writes besides a task's own start: its batched completions
    (:class:`~cron_at_scale.worker.attempts.BatchCompleter`), and the lease heartbeat of its
    running attempts (:class:`~cron_at_scale.worker.middleware.lease.Heartbeat`, put on the
    writer's thread by :func:`~cron_at_scale.worker.middleware.lease.beat_on`)."""

    def __init__(self) -> None:
        super().__init__()
        self.heartbeat = beat_on(self, Heartbeat())

    @property
    def running(self) -> dict[tuple[str, int], JobContext]:
        return self.heartbeat.running

    def add(self, ctx: JobContext) -> None:
        self.heartbeat.add(ctx)
        self.ensure_thread()

    def remove(self, ctx: JobContext) -> None:
        self.heartbeat.remove(ctx)

    def beat(self) -> None:
        self.heartbeat.beat()

    completed = BatchCompleter.complete  # hand over a succeeded attempt


writer = AttemptWriter()

MIDDLEWARE: list[Middleware] = [
    # What a worker does, one concern per middleware (cron_at_scale.worker.middleware.base.Middleware
    # lists the hooks). This list is the one statement of their order: each may rely on the ones
    # before it; every hook runs in this order, after_run in reverse. Append to it, or replace it,
    # before or after import: the hooks are read when a worker starts and whenever it changes.
    RefusePickle(),                     # at worker init: a JobTask app that would accept pickle
    WorkerHealth(),                     # the main process's watchdog of its own consumption
    LostProcess(),                      # the parent records a pool process that died in a run
    BatchStarts(),                      # BATCH_STARTS: the parent hands back started messages never begun
    IdempotentStart(writer),            # per message: start the attempt; a duplicate is skipped
    Tracing(),                          # the run's span (OpenTelemetry, if installed): child of or link to schedule()'s
    Cancellation(),                     # a job cancelled (or completed) since its claim is skipped
    CurrentJob(),                       # current_job() for the task
    Lease(writer.heartbeat, writer.ensure_thread),  # the heartbeat renews the lease while the task runs
    RetryPolicy(),                      # a failure: retry with backoff, or failed
    DeadLetter(),                       # a one-off job's final failure goes to the DLQ
    Completion(writer, InlineCompleter()),  # the success, batched; the writer flushed at shutdown
    Metrics(),                          # lags and outcomes
]
hooks = Hooks(lambda: MIDDLEWARE)  # per hook, the middleware that override it (read at worker start)


class JobTask(Task):
    """Celery task base class of cron_at_scale (set it as the app's ``task_cls``).

    ``my_task.schedule(...)`` is ``cron_at_scale.schedule(my_task, ...)``.
    """

    runs_scheduled_jobs = True  # read by RefusePickle: an app whose tasks are JobTask refuses pickle

    # Celery's request class, which holds a message published ahead of its fire_at until then
    # on the database's clock (see cron_at_scale.worker.clock). A Celery mechanism, not a concern:
    # such mechanisms are wired here or in cron_at_scale.worker.signals (the rule:
    # cron_at_scale.worker.middleware).
    Request = "cron_at_scale.worker.clock:JobRequest"
    # Celery's execution strategy: its default, whose requests the worker's main process starts
    # in batches when BATCH_STARTS is on (cron_at_scale.worker.batch_start).
    Strategy = "cron_at_scale.worker.batch_start:strategy"

    def schedule(self, **spec: Any):
        """Schedule this task; same arguments as ``cron_at_scale.schedule``. Returns the ``Job``."""
        from cron_at_scale.api.schedule import schedule

        return schedule(self, **spec)

    def retry(self, args=None, kwargs=None, exc=None, throw=True, eta=None, countdown=None, max_retries=None, **options):
        """Inside a scheduled run, retry as a database state: the job back to pending after
        ``countdown`` seconds, at ``eta``, or after the task's delay, with ``max_retries`` as this
        call's limit (``cron_at_scale.policy.retry``); elsewhere, Celery's own ``Task.retry``."""
        if current_job() is None:
            return super().retry(args=args, kwargs=kwargs, exc=exc, throw=throw, eta=eta,
                                 countdown=countdown, max_retries=max_retries, **options)
        raise ScheduledRetry(exc, retry.RetryCall(countdown, eta, max_retries))

    def __call__(self, *args, **kwargs):
        meta = job_header(self.request_stack.top)
        if meta is None:
            return super().__call__(*args, **kwargs)
        return _run_scheduled(self, meta, args, kwargs)


def _run_scheduled(task: JobTask, meta: dict, args, kwargs):
    with conf.using(conf.alias_of_job(meta["job_id"])):  # the job's own database (SHARD_DATABASES)
        return _run_hooks(task, meta, args, kwargs)


def _run_hooks(task: JobTask, meta: dict, args, kwargs):
    lists = hooks.current()  # once per message: a change of MIDDLEWARE applies from the next one
    run = Run(task, meta, worker_name())
    entered: list[Middleware] = []
    try:
        for m, before, after in lists.enter:
            if before:
                m.before_run(run)
            if after:
                entered.append(m)
        fn = _task_function(task)
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 (every task error is recorded; BaseException is a dying worker)
            for m in lists["after_failure"]:
                m.after_failure(run, exc)
            if run.outcome == "retried":  # a database state, not a Celery failure: Celery ignores it,
                raise _retried(run, exc) from exc  # and the worker announces it (worker.events)
            raise
        for m in lists["after_success"]:
            m.after_success(run, result)
        if _cancelled_while_running(run):
            raise SkipJob("cancelled")  # recorded cancelled, whatever it returned: announced revoked
        return result
    finally:
        for m in reversed(entered):
            m.after_run(run)
        _drop_broken_connections()


def _cancelled_while_running(run: Run) -> bool:
    """The task returned after its job was cancelled (it saw ``cancel_requested``): the attempt is
    recorded ``cancelled`` (``sql/worker.sql``), so a worker's monitor must see it revoked, not
    succeeded. An eager run (``task.apply()``) sends no events and keeps its return value."""
    return run.ctx is not None and run.ctx.cancel_requested and not run.task.request.is_eager


def _retried(run: Run, exc: Exception) -> SkipJob:
    """The :class:`SkipJob` that ends a retried run: its error for the ``task-retried`` event (a
    retry whose job was cancelled meanwhile is recorded ``cancelled``: announced revoked)."""
    if run.ctx is not None and run.ctx.cancel_requested:
        return SkipJob("cancelled")
    cause = exc.exc if isinstance(exc, ScheduledRetry) and exc.exc is not None else exc
    return SkipJob("retried", saferepr(cause), "".join(traceback.format_exception(cause))[-20000:])


def _task_function(task: JobTask):
    """The task's own function, past Celery's ``autoretry_for`` wrapper, which would retry with an
    ETA message: the retry policy middleware handles those exceptions itself, as a database state.
    Celery wraps ``run`` with ``functools.wraps`` only when the task has ``autoretry_for``; one level
    of ``__wrapped__`` (the standard attribute ``wraps`` sets) is its input, the user's own
    decorators included."""
    fn = task.run
    if getattr(task, "autoretry_for", None):
        fn = getattr(fn, "__wrapped__", fn)
    return fn


def _drop_broken_connections() -> None:
    # Django does this at the end of each request; a worker has no requests.
    # No query unless an error occurred or CONN_MAX_AGE passed.
    # Never inside a transaction (an eager run in a test, a task called from a view).
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close_if_unusable_or_obsolete()


from cron_at_scale.worker import signals  # noqa: E402  (Celery's signals, connected once, call the middleware's hooks)

signals.serve(hooks)
