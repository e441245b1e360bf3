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
3. runs the task, then records the outcome: a one-off job ``completed``
   (written with the process's next start, see ``AttemptWriter``); an error
   retried with backoff (a database state, never a Celery ETA) or ``failed``
   and announced on the dead-letter queue.

Messages without the header (``task.delay()``) run exactly as before.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import threading
import time
import traceback as tb
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

from celery import Task
from celery.exceptions import Ignore
from celery.signals import worker_init, worker_process_shutdown, worker_shutdown
from django.db import InterfaceError, OperationalError, connections

from . import conf, db, metrics, retry, worker_health  # noqa: F401 (worker_health: its signal handlers)
from .identity import process_name
from .publish import HEADER

log = logging.getLogger(__name__)

# Seconds a completion waits for the process's next start_attempt to carry it
# before the writer thread writes it on its own.
COMPLETION_DELAY = 0.05


@dataclass
class JobContext:
    """The scheduled run a task is executing (``current_job()``)."""

    job_id: UUID
    attempt: int
    fire_at: datetime  # the occurrence's scheduled time (aware UTC)
    schedule_type: str
    retries: int
    max_retries: int | None  # the job's; None: the task's (see cron_at_scale.retry)
    cancel_requested: bool = False
    worker: str = ""
    options: dict = field(default_factory=dict, repr=False)
    occurrence: datetime | None = None  # a recurring run's nominal occurrence (fire_at without jitter)
    # The lease ran out (a stall longer than RUN_LEASE) and the job fired again: another run may
    # be doing the same work now. Refreshed by the heartbeat; a success is still recorded.
    lease_lost: bool = False


_current: contextvars.ContextVar[JobContext | None] = contextvars.ContextVar("cron_at_scale_job", default=None)


def current_job() -> JobContext | None:
    """Inside a scheduled run: its ``job_id``, ``attempt``, scheduled ``fire_at`` (when it was due),
    ``occurrence`` (a recurring run's nominal schedule time), ``cancel_requested`` and
    ``lease_lost`` (both refreshed by the heartbeat: stop, or fence your own writes with the
    attempt number, when either turns True); ``None`` outside one."""
    return _current.get()


class _ScheduledRetry(Exception):
    """Raised by ``JobTask.retry`` inside a scheduled run: retry as a database state."""

    def __init__(self, exc: BaseException | None, call: retry.RetryCall):
        super().__init__(str(exc) if exc else "retry requested")
        self.exc = exc
        self.call = call


def job_header(request) -> dict | None:
    if request is None:
        return None
    meta = getattr(request, HEADER, None)
    if meta is None:
        meta = (getattr(request, "headers", None) or {}).get(HEADER)
    return meta if isinstance(meta, dict) else None


worker_name = process_name  # the old name


class AttemptWriter:
    """What a worker process writes besides a task's start: its completions and heartbeats.

    * A succeeded attempt is handed over (``completed``) and written with the
      process's next ``start_attempt``, in the same statement: one round trip
      per task. If no task follows within ``COMPLETION_DELAY`` seconds, this
      object's thread writes it (the same statement, starting nothing).
    * Every ``HEARTBEAT_INTERVAL`` seconds one statement renews the leases of
      the attempts running in this process and reports jobs cancelled
      meanwhile, which flips their ``cancel_requested``.

    The thread uses its own database connection (Django's are per thread). A
    completion not yet written when the process dies is not lost work: its
    attempt's lease expires and the job runs again (at-least-once), as if the
    worker had died while running it. A task that kills its process does so
    after its start, which wrote the completions before it. The worker
    flushes at shutdown.
    """

    def __init__(self):
        self.running: dict[tuple[str, int], JobContext] = {}
        self.done: list[tuple[str, int]] = []
        self.cond = threading.Condition()
        self.thread: threading.Thread | None = None
        self.pid: int | None = None
        self.stopping = threading.Event()

    def _start(self) -> None:  # under self.cond; a forked child starts its own thread
        if self.thread is None or self.pid != os.getpid() or not self.thread.is_alive():
            if self.pid is not None and self.pid != os.getpid():
                self.done = []  # a forked child's copy of its parent's queue: the parent's to write
            self.pid = os.getpid()
            self.stopping.clear()
            self.thread = threading.Thread(target=self._loop, name="cron_at_scale-writer", daemon=True)
            self.thread.start()

    def add(self, ctx: JobContext) -> None:
        with self.cond:
            self.running[(str(ctx.job_id), ctx.attempt)] = ctx
            self._start()

    def remove(self, ctx: JobContext) -> None:
        with self.cond:
            self.running.pop((str(ctx.job_id), ctx.attempt), None)

    def completed(self, job_id: str, attempt: int) -> None:
        """Hand over a succeeded attempt: the next start (or this thread) writes it."""
        with self.cond:
            self._start()
            self.done.append((job_id, attempt))
            self.cond.notify()

    def write_now(self, job_id: str, attempt: int) -> None:
        """Write a succeeded attempt now, on this thread (with any handed over before it)."""
        with self.cond:
            self.done.append((job_id, attempt))
        self.flush()

    def start(self, job_id: str, attempt: int, worker: str):
        """Start ``attempt`` of ``job_id`` and write the completions handed over so far, in one
        statement; its row (outcome, scheduled_at, ...) or None if this attempt is not to run.
        The outcome is ``running``, or ``cancelled``/``skipped`` (recorded, not to run).

        While PostgreSQL is unreachable (a restart, a failover) the start is tried again with a
        backoff for up to half the dispatch lease: the message is in hand, and an attempt still
        unstarted after its lease is fired again anyway. The same token goes with every try, so
        a try that committed without its reply is found, not skipped. Then the error is raised.
        """
        token = str(uuid4())
        deadline = time.monotonic() + float(conf.get("DISPATCH_LEASE")) / 2
        pause = 0.2
        while True:
            try:
                return self._write(job_id, attempt, worker, token)
            except (OperationalError, InterfaceError) as e:
                if time.monotonic() + pause > deadline:
                    raise
                log.warning("starting job %s attempt %d: database unavailable (%s); trying again in %.1fs",
                            job_id, attempt, str(e).strip()[:200], pause)
                db.reset_connection()
                time.sleep(pause)
                pause = min(2.0, pause * 2)

    def flush(self) -> int:
        """Write the completions handed over so far (one statement); return how many.
        On a database error they stay queued and the error is raised."""
        with self.cond:
            n = len(self.done)
        if n:
            self._write(None, 0, "", None)
        return n

    def _write(self, job_id: str | None, attempt: int, worker: str, token: str | None):
        with self.cond:
            batch, self.done = self.done, []
        try:
            return db.run("start_attempt", {
                "job_id": job_id, "attempt": attempt, "worker": worker, "token": token,
                "lease": float(conf.get("RUN_LEASE")),
                "done_job_ids": [b[0] for b in batch], "done_attempts": [b[1] for b in batch],
            }, fetch="one")
        except BaseException:
            with self.cond:
                self.done[:0] = batch
            raise

    def beat(self) -> None:
        with self.cond:
            items = list(self.running.items())
        if not items:
            return
        rows = db.run("heartbeat", {
            "lease": float(conf.get("RUN_LEASE")),
            "job_ids": [k[0] for k, _ in items],
            "attempts": [k[1] for k, _ in items],
        })
        running = dict(items)
        for job_id, attempt, reason in rows:
            ctx = running.get((str(job_id), attempt))
            if ctx is None:
                continue
            if reason == "cancelled":
                ctx.cancel_requested = True
            elif not ctx.lease_lost:
                ctx.lease_lost = True
                log.warning("job %s attempt %d: lease lost (reaped while running, the job fired again); "
                            "its success will still be recorded", job_id, attempt)

    def _loop(self) -> None:
        interval = float(conf.get("HEARTBEAT_INTERVAL"))
        next_beat = time.monotonic() + interval
        while not self.stopping.is_set():
            with self.cond:
                if not self.done:
                    self.cond.wait(max(0.0, next_beat - time.monotonic()))
            if self.done and not self.stopping.is_set():  # the next task's start may carry them
                self.stopping.wait(COMPLETION_DELAY)
            try:  # keep going: a database blip must end neither the writes nor the heartbeat
                self.flush()
            except Exception:
                log.exception("writing completed attempts failed; trying again")
                db.reset_connection()
                time.sleep(0.5)
            if time.monotonic() >= next_beat:
                next_beat = time.monotonic() + interval
                try:
                    self.beat()
                except Exception:
                    log.exception("heartbeat failed")
                    db.reset_connection()
        connections.close_all()  # this thread's own

    def stop(self, timeout: float = 5.0) -> None:
        """Write what is queued, end the thread and close its connection (worker shutdown, tests)."""
        self.stopping.set()
        with self.cond:
            self.cond.notify()
        if self.thread is not None and self.pid == os.getpid():
            self.thread.join(timeout)
        if self.done:
            self.flush()


writer = AttemptWriter()


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
    from .celery_app import refuse_pickle

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
        """Inside a scheduled run, retry as a database state: the job back to pending after
        ``countdown`` seconds, at ``eta``, or after the task's delay, with ``max_retries`` as this
        call's limit (``cron_at_scale.retry``); elsewhere, Celery's own ``Task.retry``."""
        if current_job() is None:
            return super().retry(args=args, kwargs=kwargs, exc=exc, throw=throw, eta=eta,
                                 countdown=countdown, max_retries=max_retries, **options)
        raise _ScheduledRetry(exc, retry.RetryCall(countdown, eta, max_retries))

    def __call__(self, *args, **kwargs):
        meta = job_header(self.request_stack.top)
        if meta is None:
            return super().__call__(*args, **kwargs)
        return _run_scheduled(self, meta, args, kwargs)


def _run_scheduled(task: JobTask, meta: dict, args, kwargs):
    job_id, attempt = meta["job_id"], int(meta["attempt"])
    me = worker_name()
    row = writer.start(job_id, attempt, me)
    if row is None:
        log.info("skipping job %s attempt %d: already started or superseded", job_id, attempt)
        raise Ignore()
    outcome, scheduled_at, schedule_type, cancel_requested, retries, max_retries, options, started_at, created, started = row
    if started != attempt:  # this message was reaped in the queue; it runs the attempt that re-fired it
        log.info("job %s: message of attempt %d (lease ran out in the queue) runs attempt %d", job_id, attempt, started)
        attempt = started
    # firing lag, database clock on both ends; from the job's creation if it was scheduled at a past time
    metrics.observe_start((started_at - max(scheduled_at, created)).total_seconds())
    if outcome != "running":  # recorded as cancelled (job cancelled) or skipped (job already completed)
        log.info("skipping job %s attempt %d: %s", job_id, attempt, outcome)
        raise Ignore()
    ctx = JobContext(UUID(job_id), attempt, scheduled_at, schedule_type, retries, max_retries,
                     cancel_requested=cancel_requested, worker=me, options=_json(options),
                     occurrence=_occurrence(meta, scheduled_at))
    token = _current.set(ctx)
    writer.add(ctx)
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
        writer.remove(ctx)
        _current.reset(token)
        _drop_broken_connections()
    if task.request.is_eager or any(c.in_atomic_block for c in connections.all(initialized_only=True)):
        writer.write_now(job_id, attempt)  # task.apply() or inside a transaction: the caller reads it next
    else:
        writer.completed(job_id, attempt)
    metrics.observe_outcome("succeeded")
    return result


def _record_failure(task: JobTask, ctx: JobContext, exc: Exception) -> bool:
    """Record a failed attempt; True if the job will be retried."""
    call, cause = (exc.call, exc.exc or exc) if isinstance(exc, _ScheduledRetry) else (None, exc)
    error = f"{type(cause).__module__}.{type(cause).__qualname__}: {cause}"[:2000]
    trace = "".join(tb.format_exception(cause))[-20000:]
    params = {"job_id": str(ctx.job_id), "attempt": ctx.attempt, "error": error, "traceback": trace}
    decision = retry.decide(task, cause, ctx.retries, ctx.max_retries, call=call, job_options=ctx.options,
                            retry_all=bool(conf.get("RETRY_ALL_EXCEPTIONS")))
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


from . import worker_lost  # noqa: E402,F401  (its signal receivers: the parent records a pool process dying in a run)
