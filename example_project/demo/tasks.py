"""Tasks the demo and the tests schedule."""

import os
import signal
import time
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone

from celery import shared_task
from celery.signals import task_failure

from cron_at_scale import RetryableError, current_job


@shared_task
def noop(*args, **kwargs):
    """Do nothing."""


@shared_task
def record(*args, **kwargs):
    """Write one ``demo_execution`` row: job id and attempt of this run, database time."""
    from .models import Execution

    job = current_job()
    Execution.objects.create(job_id=job.job_id if job else None, attempt=job.attempt if job else None,
                             occurrence=job.occurrence if job else None, pid=os.getpid())


@shared_task
def sleep(seconds: float = 1.0, record_run: bool = True):
    """Sleep ``seconds``, checking for cancellation every 0.1 s; record the run."""
    deadline = time.monotonic() + float(seconds)
    while time.monotonic() < deadline:
        job = current_job()
        if job is not None and job.cancel_requested:
            return "cancelled"
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
    if record_run:
        record()
    return "slept"


@shared_task(retry_backoff=1, retry_jitter=False)
def fail(times: int = 1):
    """Raise ``RetryableError`` on the first ``times`` attempts, then record a run."""
    job = current_job()
    if job is not None and job.attempt <= int(times):
        raise RetryableError(f"failing attempt {job.attempt} of {times}")
    record()


@shared_task(retry_backoff=0.2, retry_jitter=False)
def crash():
    """Kill the worker process running it (a poison job): no Python cleanup, like a segfault.
    The worker's parent records the attempt failed ("exit code 1"), retried per the job's policy."""
    os._exit(1)


def _dies(times) -> bool:
    job = current_job()
    return times is None or (job is not None and job.attempt <= int(times))


@shared_task(retry_backoff=0.2, retry_jitter=False)
def kill_self(times: int | None = None):
    """SIGKILL the pool process running it (as the OOM killer would) on the first ``times`` attempts
    (every attempt when None), then record a run."""
    if _dies(times):
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(10)  # the signal is asynchronous: never return before it lands
    record()


@shared_task(time_limit=2, retry_backoff=0.2, retry_jitter=False)
def over_time_limit(times: int | None = None, seconds: float = 30.0):
    """Sleep ``seconds`` past Celery's hard ``time_limit`` (2 s: the parent terminates the process)
    on the first ``times`` attempts (every attempt when None), then record a run."""
    if _dies(times):
        time.sleep(float(seconds))
    record()


@shared_task(autoretry_for=(ValueError,), retry_backoff=1, retry_jitter=False)
def flaky(times: int = 1):
    """Raise ``ValueError`` (retried through ``autoretry_for``) on the first ``times`` attempts."""
    job = current_job()
    if job is not None and job.attempt <= int(times):
        raise ValueError(f"flaky attempt {job.attempt}")
    record()


@shared_task(bind=True)
def retry_self(self, times: int = 1):
    """Call ``self.retry(countdown=0)`` on the first ``times`` attempts."""
    job = current_job()
    if job is not None and job.attempt <= int(times):
        raise self.retry(countdown=0, exc=RuntimeError(f"retry_self attempt {job.attempt}"))
    record()


def _ledger_line(path: str, *extra: str) -> None:
    job = current_job()
    words = [str(job.job_id) if job else "-", str(job.attempt) if job else "-", str(os.getpid()), f"{time.time():.6f}"]
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (" ".join([*words, *extra]) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


@shared_task
def ledger(path: str, seconds: float = 0.0, end: bool = False):
    """Append this run's ``job_id attempt pid unix_time`` to the file ``path`` (fsync'd) before
    anything else, then sleep ``seconds``: a record of executions that shares nothing with the
    jobs' database, so a crash of that database cannot hide a run. ``end``: after the sleep, append
    the same line ending in ``end`` (the run returned)."""
    _ledger_line(path)
    if seconds:
        time.sleep(float(seconds))
    if end:
        _ledger_line(path, "end")


# Tasks declared with Celery's retry options, run both as plain Celery tasks (``apply_async``) and
# scheduled; each attempt appends its time to the Redis list ``retry-ledger:<tag>`` and the final
# failure appends "failed" (tests compare attempt counts and delays).
@contextmanager
def broker_redis():
    """A redis-py client of the Celery broker, through kombu, which also reads the embedded
    broker's ``redis+socket://`` URL (redis-py does not)."""
    from django.conf import settings
    from kombu import Connection

    with Connection(settings.CELERY_BROKER_URL) as conn:
        yield conn.default_channel.client


def _ledger_push(tag: str, entry: str) -> None:
    with broker_redis() as r:
        r.rpush(f"retry-ledger:{tag}", entry)


@task_failure.connect
def _ledger_failed(sender=None, kwargs=None, **_):
    if getattr(sender, "name", "").startswith("demo.tasks.celery_") and (kwargs or {}).get("tag"):
        _ledger_push(kwargs["tag"], "failed")


@shared_task(autoretry_for=(ValueError,), max_retries=4, retry_backoff=True, retry_jitter=False)
def celery_backoff(tag: str):
    """Always fails: max_retries=4 (5 attempts), retry_backoff=True (1, 2, 4, 8 s)."""
    _ledger_push(tag, f"{time.time():.6f}")
    raise ValueError("celery_backoff")


@shared_task(autoretry_for=(ValueError,), retry_kwargs={"max_retries": 4}, retry_backoff=1, retry_backoff_max=2,
             retry_jitter=False)
def celery_capped(tag: str):
    """Always fails: retry_kwargs max_retries=4 (5 attempts), retry_backoff=1 capped at 2 (1, 2, 2, 2 s)."""
    _ledger_push(tag, f"{time.time():.6f}")
    raise ValueError("celery_capped")


@shared_task(autoretry_for=(ValueError,), max_retries=4, retry_backoff=2, retry_backoff_max=2)
def celery_jitter(tag: str):
    """Always fails: 5 attempts, each delay a whole number of seconds drawn from 0..2 (full jitter)."""
    _ledger_push(tag, f"{time.time():.6f}")
    raise ValueError("celery_jitter")


@shared_task(bind=True, max_retries=5, default_retry_delay=1)
def celery_self_retry(self, tag: str):
    """Always fails through self.retry: countdown=2, eta in 1 s, default_retry_delay (1 s), then
    max_retries=3 for that call (4 attempts)."""
    _ledger_push(tag, f"{time.time():.6f}")
    exc, n = RuntimeError(f"celery_self_retry {self.request.retries}"), self.request.retries
    if n == 0:
        raise self.retry(exc=exc, countdown=2)
    if n == 1:
        raise self.retry(exc=exc, eta=datetime.now(timezone.utc) + timedelta(seconds=1))
    if n == 2:
        raise self.retry(exc=exc)
    raise self.retry(exc=exc, max_retries=3)
