"""A scheduled run that kills its pool process: recorded by the worker's parent, with its cause.

A task that dies with its Celery prefork child (a hard ``time_limit``, the
OOM killer, a segfault, ``os.kill(os.getpid(), SIGKILL)``) leaves nothing
for the middleware to write: its process is gone. The worker's parent
process sees it at once and sends Celery's ``task_failure`` signal there
(``celery.worker.request.Request.on_failure``, Celery 5.5-5.7), with

* ``billiard.exceptions.TimeLimitExceeded`` for a hard time limit
  (billiard's ``on_hard_timeout`` fails the job, then terminates the child;
  Celery 5.7 sends the signal a second time from ``Request.on_timeout``),
* ``billiard.exceptions.WorkerLostError`` for a child that died (its
  message says the signal or exit code).

:class:`LostProcess`, a middleware of ``cron_at_scale.worker.task.MIDDLEWARE``
(its hooks run in the parent, from Celery's signals), records such
a failure of a scheduled run as the job's own, as the middleware does for an
exception (``middleware.retry_policy.RetryPolicy``), instead of leaving the attempt to
expire after ``RUN_LEASE`` and count as lost toward ``MAX_LOST_ATTEMPTS``:

* the attempt the dead process was running ends ``failed`` or ``retried``
  with the cause as its error, e.g. ``billiard.exceptions.TimeLimitExceeded:
  hard time limit (5s) exceeded`` or ``billiard.exceptions.WorkerLostError:
  worker process exited by signal 9 (SIGKILL)``;
* the job's own policy decides (``retry.decide``: its ``max_retries`` and
  backoff). A killed or crashed process (``WorkerLostError``) is retried
  like a ``RetryableError``: the OOM killer or a node under pressure may not
  strike again. A hard time limit keeps Celery's meaning, a failure of the
  task: retried only if its ``autoretry_for`` (or ``retry_all_exceptions``,
  ``RETRY_ALL_EXCEPTIONS``) covers ``TimeLimitExceeded``;
* a one-off job that failed for good goes to the dead-letter queue with the
  cause; a recurring job's run is recorded failed and the schedule goes on.

Only an attempt still ``running`` in that very process is touched: one the
reaper or another worker moved on, or whose success was written first, is
left as it is. A child lost after the worker began shutting down (a cold
shutdown kills its children) is not the job's fault: its attempt expires
and fires again, as before. When the parent cannot write (database down)
the lease does the same.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import weakref

from billiard.exceptions import TimeLimitExceeded, WorkerLostError
from celery.utils.saferepr import saferepr

from cron_at_scale import conf
from cron_at_scale import sql as db
from cron_at_scale.broker.message import HEADER
from cron_at_scale.exceptions import RetryableError
from cron_at_scale.ops import metrics
from cron_at_scale.policy import retry
from cron_at_scale.worker import attempts as worker_attempts
from cron_at_scale.worker import batch_start
from cron_at_scale.worker.events import AnnouncingRequest
from cron_at_scale.worker.middleware.base import Middleware

log = logging.getLogger(__name__)

# Scheduled requests this (parent) process received, by Celery task id; gone with their Request.
_requests: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_shutting_down = False

_SIGNAL = re.compile(r"signal (\d+) \((\w+)\)")
_EXITCODE = re.compile(r"exitcode (-?\d+)")


class LostProcess(Middleware):
    """The parent's record of a pool process that died in a scheduled run (see the module doc)."""

    def after_message_received(self, request) -> None:
        """Parent: keep the request of a scheduled message (its header and, once started, its pool pid)."""
        if request is not None and isinstance((request.request_dict or {}).get(HEADER), dict):
            _requests[request.id] = request

    def after_process_boot(self) -> None:
        _requests.clear()  # a pool child's copy of its parent's requests: not its own

    def before_worker_shutdown(self) -> None:
        global _shutting_down
        _shutting_down = True

    def after_task_failure(self, task, task_id: str, exc: BaseException) -> None:
        _on_task_failure(task, task_id, exc)


def cause_of(exc: BaseException) -> tuple[str, bool]:
    """``(cause, killed)`` of a pool process's death: a readable cause, and whether the process
    died on its own (``WorkerLostError``) rather than at a hard time limit."""
    if isinstance(exc, TimeLimitExceeded):
        limit = exc.args[0] if exc.args else None
        return (f"hard time limit ({limit:g}s) exceeded" if isinstance(limit, (int, float))
                else "hard time limit exceeded"), False
    text = str(exc)
    if m := _SIGNAL.search(text):
        return f"worker process exited by signal {m.group(1)} ({m.group(2)})", True
    if m := _EXITCODE.search(text):
        return f"worker process exited with exit code {m.group(1)}", True
    return f"worker process lost: {text}", True


def _on_task_failure(sender, task_id, exception) -> None:
    if not isinstance(exception, (TimeLimitExceeded, WorkerLostError)):
        return  # raised in the task: the middleware recorded it in the child
    request = _requests.pop(task_id, None)  # popped: Celery 5.7 reports a hard time limit twice
    if request is None or request.worker_pid is None:
        return  # not a scheduled run, already handled, or never started in a pool process
    if _shutting_down and isinstance(exception, WorkerLostError):
        return  # a (cold) shutdown killed it: the lease brings the run back
    meta = request.request_dict[HEADER]
    try:
        started = batch_start.started_of(request)
        token = started["token"] if started is not None else None
        if record(sender, meta, request.worker_pid, exception, task_id, token) == "retried" and \
                isinstance(request, AnnouncingRequest):  # a monitor must see it retried, not failed
            request.retried_in_parent = (saferepr(exception), cause_of(exception)[0])
    except Exception:  # noqa: BLE001 (the attempt's lease still expires and the run comes back)
        log.exception("could not record the death of job %s's pool process", meta.get("job_id"))
    finally:
        if not db.get_connection().in_atomic_block:
            db.reset_connection()  # the parent forks new pool processes: hold no connection they could inherit


def record(task, meta: dict, pid: int, exc: BaseException, task_id: str = "", token: str | None = None) -> str | None:
    """Record the death of pool process ``pid`` while it ran the scheduled message ``meta``
    (the ``cron_at_scale`` header: ``job_id``, ``attempt``) of ``task``, with ``exc`` (a
    ``TimeLimitExceeded`` or ``WorkerLostError``) as its cause.

    ``token``: the run token of the message's start in a batch by the main process
    (:mod:`cron_at_scale.worker.batch_start`), whose attempt names that process, not ``pid``.

    Returns the attempt's new outcome (``"retried"`` or ``"failed"``), or None when that
    process was running no attempt of the job (never started it, or it finished meanwhile).
    Raises the database's errors.
    """
    with conf.using(conf.alias_of_job(meta["job_id"])):  # the job's own database (SHARD_DATABASES)
        return _record(task, meta, pid, exc, task_id, token)


def _record(task, meta: dict, pid: int, exc: BaseException, task_id: str, token: str | None) -> str | None:
    worker = f"{socket.gethostname()}:{pid}"  # what worker.worker_name() wrote in that process
    row = db.run("running_attempt_of_worker", {
        "job_id": str(meta["job_id"]), "attempt": int(meta["attempt"]), "worker": worker, "token": token},
        fetch="one")
    if row is None:
        return None
    attempt, schedule_type, retries, max_retries, options = row
    cause, killed = cause_of(exc)
    error = f"{type(exc).__module__}.{type(exc).__qualname__}: {cause}"
    trace = (f"{cause}: seen by the worker's parent process; pool process {worker} was running "
             f"task {task.name} [{task_id}], attempt {attempt}. No Python traceback: the process is gone.")
    params = {"job_id": str(meta["job_id"]), "attempt": attempt, "error": error, "traceback": trace}
    if isinstance(options, str):  # Django's PostgreSQL backend hands jsonb to raw cursors as text
        options = json.loads(options)
    decision = retry.decide(task, RetryableError(cause) if killed else exc, retries, max_retries,
                            job_options=options or {}, retry_all=bool(conf.get("RETRY_ALL_EXCEPTIONS")))
    if schedule_type == "once" and decision.retry:
        worker_attempts.write_retry(params, decision.delay)
        log.warning("job %s attempt %d: %s; retry in %.1fs", meta["job_id"], attempt, cause, decision.delay)
        metrics.observe_outcome("retried")
        return "retried"
    failed_job = worker_attempts.write_failure(params)
    log.error("job %s attempt %d failed: %s", meta["job_id"], attempt, cause)
    metrics.observe_outcome("failed")
    if schedule_type == "once" and failed_job:
        from cron_at_scale.broker.dlq import announce

        announce(task.app, meta["job_id"], attempt, task.name, error)
        metrics.observe_dead_lettered()
    return "failed"
