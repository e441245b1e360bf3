"""The Celery side: ``JobTask``, the task class that runs a scheduled message through the middleware.

Configure the Celery app once, so every task (also plain ``@shared_task``)
gets it::

    app = Celery("proj", task_cls="cron_at_scale.worker:JobTask")

A message the dispatcher published carries a ``cron_at_scale`` header; such a
message runs through :data:`MIDDLEWARE` (:mod:`cron_at_scale.worker.middleware`, one
concern per class, in this order): the idempotent start, cancellation,
``current_job()``, the lease heartbeat, the retry policy, the dead-letter
queue, the completion, the metrics. Messages without the header
(``task.delay()``) run exactly as before.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import Task
from celery.signals import worker_init, worker_process_shutdown, worker_shutdown
from django.db import connections

from cron_at_scale import conf
from cron_at_scale.broker.publish import HEADER
from cron_at_scale.ops.identity import process_name
from cron_at_scale.policy import retry
from cron_at_scale.worker import health as worker_health  # noqa: F401 (its signal handlers)
from cron_at_scale.worker.attempts import COMPLETION_DELAY, BatchCompleter, InlineCompleter
from cron_at_scale.worker.middleware import JobContext, Middleware, Run, SkipJob, current_job
from cron_at_scale.worker.middleware.cancellation import Cancellation
from cron_at_scale.worker.middleware.completion import Completion
from cron_at_scale.worker.middleware.context import CurrentJob
from cron_at_scale.worker.middleware.dead_letter import DeadLetter
from cron_at_scale.worker.middleware.lease import Heartbeat, Lease
from cron_at_scale.worker.middleware.metrics import Metrics
from cron_at_scale.worker.middleware.retry_policy import RetryPolicy, ScheduledRetry
from cron_at_scale.worker.middleware.start import IdempotentStart

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
    (:class:`~cron_at_scale.worker.attempts.BatchCompleter`) and, on the same thread, the heartbeat of
    its running attempts every ``HEARTBEAT_INTERVAL`` seconds
    (:class:`~cron_at_scale.worker.middleware.lease.Heartbeat`)."""

    def __init__(self) -> None:
        super().__init__()
        self.heartbeat = Heartbeat()
        self.every(lambda: float(conf.get("HEARTBEAT_INTERVAL")), self.heartbeat.beat)

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

# The order is the contract: each concern may rely on the ones before it.
MIDDLEWARE: list[Middleware] = [
    IdempotentStart(writer),
    Cancellation(),
    CurrentJob(),
    Lease(writer.heartbeat, writer.ensure_thread),
    RetryPolicy(),
    DeadLetter(),
    Completion(writer, InlineCompleter()),
    Metrics(),
]


@worker_process_shutdown.connect
@worker_shutdown.connect
def _flush_at_shutdown(**kwargs) -> None:
    if writer.pid == os.getpid():
        try:
            writer.stop()
        except Exception:  # the leases expire and the jobs run again: at-least-once
            log.exception("could not write %d completed attempts at shutdown", len(writer.done))


@worker_init.connect
def _refuse_pickle(sender=None, **kwargs):
    """A worker of an app set up with JobTask refuses to start if it would accept pickle."""
    from cron_at_scale.celery_app import refuse_pickle

    app = getattr(sender, "app", None)
    if app is not None and isinstance(app.Task, type) and issubclass(app.Task, JobTask):
        refuse_pickle(app)


class JobTask(Task):
    """Celery task base class of cron_at_scale (set it as the app's ``task_cls``).

    ``my_task.schedule(...)`` is ``cron_at_scale.schedule(my_task, ...)``.
    """

    # Celery's request class, which holds a message published ahead of its fire_at until then
    # on the database's clock (see cron_at_scale.worker.clock).
    Request = "cron_at_scale.worker.clock:JobRequest"

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


def _hooked(hook: str) -> list[Middleware]:
    """The middleware of MIDDLEWARE that override ``hook`` (the others' would do nothing), in order."""
    return [m for m in MIDDLEWARE if getattr(type(m), hook) is not getattr(Middleware, hook)]


# Per hook, computed once: a task pays for the hooks that do something, not for empty calls.
_FAILURE, _SUCCESS = _hooked("after_failure"), _hooked("after_success")
_ENTER = [(m, m in _hooked("before_run"), m in _hooked("after_run")) for m in MIDDLEWARE]
_ENTER = [(m, before, after) for m, before, after in _ENTER if before or after]


def _run_scheduled(task: JobTask, meta: dict, args, kwargs):
    run = Run(task, meta, worker_name())
    entered: list[Middleware] = []
    try:
        for m, before, after in _ENTER:
            if before:
                m.before_run(run)
            if after:
                entered.append(m)
        fn = _task_function(task)
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 (every task error is recorded; BaseException is a dying worker)
            for m in _FAILURE:
                m.after_failure(run, exc)
            if run.outcome == "retried":
                raise SkipJob() from exc  # retried: a database state, not a Celery failure
            raise
        for m in _SUCCESS:
            m.after_success(run, result)
        return result
    finally:
        for m in reversed(entered):
            m.after_run(run)
        _drop_broken_connections()


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


from cron_at_scale.worker import lost as worker_lost  # noqa: E402,F401  (its signal receivers: the parent records a pool process dying in a run)
