"""Worker middleware: what runs around a scheduled task inside a Celery worker.

Configure the Celery app once, so every task (also plain ``@shared_task``)
gets it::

    app = Celery("proj", task_cls="cron_at_scale.worker:JobTask")

A message the dispatcher published carries a ``cron_at_scale`` header; for
such a message the middleware

1. starts the attempt in one statement (a redelivered or superseded message
   starts nothing and is skipped; a job cancelled since its claim is recorded
   as a cancelled attempt and skipped),
2. keeps the attempt's lease alive with a heartbeat while the task runs,
3. runs the task, then records the outcome: a one-off job ``completed``; an
   error retried with backoff (a database state, never a Celery ETA) or
   ``failed`` and announced on the dead-letter queue.

Messages without the header (``task.delay()``) run exactly as before.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import socket
import threading
import traceback as tb
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from celery import Task
from celery.exceptions import Ignore
from celery.signals import worker_init
from django.db import connections

from . import conf, db, metrics, retry
from .publish import HEADER

log = logging.getLogger(__name__)


@dataclass
class JobContext:
    """The scheduled run a task is executing (``current_job()``)."""

    job_id: UUID
    attempt: int
    fire_at: datetime  # the occurrence's scheduled time (aware UTC)
    schedule_type: str
    retries: int
    max_retries: int
    cancel_requested: bool = False
    worker: str = ""
    options: dict = field(default_factory=dict, repr=False)
    occurrence: datetime | None = None  # a recurring run's nominal occurrence (fire_at without jitter)


_current: contextvars.ContextVar[JobContext | None] = contextvars.ContextVar("cron_at_scale_job", default=None)


def current_job() -> JobContext | None:
    """Inside a scheduled run: its ``job_id``, ``attempt``, scheduled ``fire_at`` (when it was due),
    ``occurrence`` (a recurring run's nominal schedule time) and ``cancel_requested`` (refreshed
    by the heartbeat); ``None`` outside one."""
    return _current.get()


class _ScheduledRetry(Exception):
    """Raised by ``JobTask.retry`` inside a scheduled run: retry as a database state."""

    def __init__(self, exc: BaseException | None, countdown: float | None, max_retries: int | None):
        super().__init__(str(exc) if exc else "retry requested")
        self.exc = exc
        self.countdown = countdown
        self.max_retries = max_retries


def job_header(request) -> dict | None:
    if request is None:
        return None
    meta = getattr(request, HEADER, None)
    if meta is None:
        meta = (getattr(request, "headers", None) or {}).get(HEADER)
    return meta if isinstance(meta, dict) else None


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Heartbeat:
    """A thread per worker process extending the leases of its running attempts.

    Uses its own database connection (Django's are per thread); every
    ``HEARTBEAT_INTERVAL`` seconds one statement renews all leases and reports
    jobs cancelled meanwhile, which flips their ``cancel_requested``.
    """

    def __init__(self):
        self.running: dict[tuple[str, int], JobContext] = {}
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.pid = None

    def add(self, ctx: JobContext) -> None:
        with self.lock:
            self.running[(str(ctx.job_id), ctx.attempt)] = ctx
            if self.thread is None or self.pid != os.getpid() or not self.thread.is_alive():
                self.pid = os.getpid()
                self.thread = threading.Thread(target=self._loop, name="cron_at_scale-heartbeat", daemon=True)
                self.thread.start()

    def remove(self, ctx: JobContext) -> None:
        with self.lock:
            self.running.pop((str(ctx.job_id), ctx.attempt), None)

    def beat(self) -> None:
        with self.lock:
            items = list(self.running.items())
        if not items:
            return
        rows = db.run("heartbeat", {
            "lease": float(conf.get("RUN_LEASE")),
            "job_ids": [k[0] for k, _ in items],
            "attempts": [k[1] for k, _ in items],
        })
        cancelled = {str(r[0]) for r in rows}
        for (job_id, _), ctx in items:
            if job_id in cancelled:
                ctx.cancel_requested = True

    def _loop(self) -> None:
        interval = float(conf.get("HEARTBEAT_INTERVAL"))
        stop = threading.Event()
        while not stop.wait(interval):
            try:
                self.beat()
            except Exception:  # keep beating: a database blip must not end the heartbeat
                log.exception("heartbeat failed")
                db.reset_connection()


heartbeat = Heartbeat()


@worker_init.connect
def _refuse_pickle(sender=None, **kwargs):
    """A worker of an app set up with JobTask refuses to start if it would accept pickle."""
    from .checks import refuse_pickle

    app = getattr(sender, "app", None)
    if app is not None and isinstance(app.Task, type) and issubclass(app.Task, JobTask):
        refuse_pickle(app)


class JobTask(Task):
    """Celery task base class of cron_at_scale (set it as the app's ``task_cls``).

    ``my_task.schedule(...)`` is ``cron_at_scale.schedule(my_task, ...)``.
    """

    def schedule(self, **spec: Any):
        """Schedule this task; same arguments as ``cron_at_scale.schedule``. Returns the ``Job``."""
        from .scheduling import schedule

        return schedule(self, **spec)

    def retry(self, args=None, kwargs=None, exc=None, throw=True, eta=None, countdown=None, max_retries=None, **options):
        """Inside a scheduled run, retry as a database state (job back to pending after
        the backoff or ``countdown`` seconds); elsewhere, Celery's own ``Task.retry``."""
        if current_job() is None:
            return super().retry(args=args, kwargs=kwargs, exc=exc, throw=throw, eta=eta,
                                 countdown=countdown, max_retries=max_retries, **options)
        raise _ScheduledRetry(exc, countdown, max_retries)

    def __call__(self, *args, **kwargs):
        meta = job_header(self.request_stack.top)
        if meta is None:
            return super().__call__(*args, **kwargs)
        return _run_scheduled(self, meta, args, kwargs)


def _run_scheduled(task: JobTask, meta: dict, args, kwargs):
    job_id, attempt = meta["job_id"], int(meta["attempt"])
    me = worker_name()
    row = db.run("start_attempt", {"job_id": job_id, "attempt": attempt, "worker": me,
                                   "lease": float(conf.get("RUN_LEASE"))}, fetch="one")
    if row is None:
        log.info("skipping job %s attempt %d: already started or superseded", job_id, attempt)
        raise Ignore()
    outcome, scheduled_at, schedule_type, cancel_requested, retries, max_retries, options, started_at = row
    metrics.observe_start((started_at - scheduled_at).total_seconds())  # database clock on both ends
    if outcome == "cancelled":
        log.info("skipping job %s attempt %d: cancelled", job_id, attempt)
        raise Ignore()
    ctx = JobContext(UUID(job_id), attempt, scheduled_at, schedule_type, retries, max_retries,
                     cancel_requested, me, _json(options), _occurrence(meta, scheduled_at))
    token = _current.set(ctx)
    heartbeat.add(ctx)
    task.request.retries = retries  # as Celery's own retries would show it
    # Celery's autoretry_for wrapper would retry with an ETA message; the
    # middleware handles those exceptions itself (a database state).
    run = getattr(task, "_orig_run", None) or task.run
    try:
        result = run(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 (every task error is recorded; BaseException is a dying worker)
        if _record_failure(task, ctx, exc):
            raise Ignore() from exc  # retried: a database state, not a Celery failure
        raise
    finally:
        heartbeat.remove(ctx)
        _current.reset(token)
        _drop_broken_connections()
    db.run("finish_attempt", {"job_id": job_id, "attempt": attempt, "outcome": "succeeded",
                              "status": "completed", "error": "", "traceback": ""}, fetch="count")
    metrics.observe_outcome("succeeded")
    return result


def _record_failure(task: JobTask, ctx: JobContext, exc: Exception) -> bool:
    """Record a failed attempt; True if the job will be retried."""
    countdown = None
    cause: BaseException = exc
    max_retries = ctx.max_retries
    if isinstance(exc, _ScheduledRetry):
        countdown, cause = exc.countdown, (exc.exc or exc)
        if exc.max_retries is not None:
            max_retries = exc.max_retries
    error = f"{type(cause).__module__}.{type(cause).__qualname__}: {cause}"[:2000]
    trace = "".join(tb.format_exception(cause))[-20000:]
    params = {"job_id": str(ctx.job_id), "attempt": ctx.attempt, "error": error, "traceback": trace}
    retryable = isinstance(exc, _ScheduledRetry)
    decision = retry.decide(task, cause if not retryable else _as_retryable(cause), ctx.retries, max_retries,
                            countdown, job_options=ctx.options, retry_all=bool(conf.get("RETRY_ALL_EXCEPTIONS")))
    if ctx.schedule_type == "once" and decision.retry:
        db.run("retry_attempt", {**params, "delay": decision.delay}, fetch="count")
        log.info("job %s attempt %d failed (%s); retry in %.1fs", ctx.job_id, ctx.attempt, error, decision.delay)
        metrics.observe_outcome("retried")
        return True
    db.run("finish_attempt", {**params, "outcome": "failed", "status": "failed"}, fetch="count")
    metrics.observe_outcome("failed")
    if ctx.schedule_type == "once":
        from .dlq import announce

        announce(task.app, ctx.job_id, ctx.attempt, task.name, error)
        metrics.observe_dead_lettered()
    return False


def _occurrence(meta: dict, default: datetime) -> datetime:
    try:
        return datetime.fromisoformat(meta["occurrence"])
    except (KeyError, TypeError, ValueError):
        return default


def _json(value) -> dict:
    # Django's PostgreSQL backend hands jsonb to raw cursors as text.
    return json.loads(value) if isinstance(value, str) else (value or {})


def _drop_broken_connections() -> None:
    # Django does this at the end of each request; a worker has no requests.
    # No query unless an error occurred or CONN_MAX_AGE passed.
    # Never inside a transaction (an eager run in a test, a task called from a view).
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close_if_unusable_or_obsolete()


def _as_retryable(cause: BaseException) -> BaseException:
    from .exceptions import RetryableError

    return cause if isinstance(cause, RetryableError) else RetryableError(str(cause))
