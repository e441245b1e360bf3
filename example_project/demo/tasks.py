"""Tasks the demo and the tests schedule."""

import os
import signal
import time

from celery import shared_task

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


@shared_task
def ledger(path: str, seconds: float = 0.0):
    """Append this run's ``job_id attempt pid unix_time`` to the file ``path`` (fsync'd) before
    anything else, then sleep ``seconds``: a record of executions that shares nothing with the
    jobs' database, so a crash of that database cannot hide a run."""
    job = current_job()
    line = f"{job.job_id if job else '-'} {job.attempt if job else '-'} {os.getpid()} {time.time():.6f}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    if seconds:
        time.sleep(float(seconds))
