"""Tasks of the nemesis run (tests/nemesis): each writes an outside ledger before anything else.

The ledger is the truth the nemesis checker trusts, so it lives outside the
jobs' PostgreSQL and survives every fault it injects: one append-only file
per process under ``$NEMESIS_LEDGER_DIR``, one JSON line per event, written
with ``O_APPEND`` and fsync'd before the task goes on. Each line:
``{"ev": "start"|"end", "job": uuid, "attempt": int, "fire_at": ISO UTC,
"occurrence": ISO UTC or null, "wall": real UNIX seconds, "pid": int,
"offset": seconds the process clock is faked by}``. ``wall`` comes from
``CLOCK_REALTIME`` directly, which the fault suite's fake clock does not
shift; ``offset`` is what ``time.time()`` adds to it here; ``node``: the
nemesis node that ran it (``$NEMESIS_NODE``, null outside a nemesis run).

Without ``NEMESIS_LEDGER_DIR`` the tasks write nothing (they stay importable
by every worker of the example project).
"""

from __future__ import annotations

import json
import os
import time

from celery import shared_task

from cron_at_scale import RetryableError, current_job

_fd: int | None = None
_fd_pid: int | None = None


def _ledger_fd() -> int | None:
    global _fd, _fd_pid
    directory = os.environ.get("NEMESIS_LEDGER_DIR")
    if not directory:
        return None
    if _fd is None or _fd_pid != os.getpid():  # a prefork child opens its own file
        path = os.path.join(directory, f"ledger-{os.uname().nodename}-{os.getpid()}.jsonl")
        _fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        _fd_pid = os.getpid()
    return _fd


def append(ev: str) -> None:
    """Append one ``ev`` line for the current job (none outside a scheduled run) and fsync it."""
    job = current_job()
    fd = _ledger_fd()
    if job is None or fd is None:
        return
    real = time.clock_gettime(time.CLOCK_REALTIME)
    line = json.dumps({
        "ev": ev, "job": str(job.job_id), "attempt": job.attempt, "fire_at": job.fire_at.isoformat(),
        "occurrence": job.occurrence.isoformat() if job.occurrence else None, "wall": real,
        "pid": os.getpid(), "offset": round(time.time() - real, 3), "node": os.environ.get("NEMESIS_NODE"),
    }) + "\n"
    copies = 2 if os.environ.get("NEMESIS_SELFTEST_DOUBLE") == ev else 1  # a broken build for the self-test
    for _ in range(copies):
        os.write(fd, line.encode())
    os.fsync(fd)


@shared_task
def record(*args, **kwargs):
    """Ledger a start, do nothing, ledger the end."""
    append("start")
    append("end")


@shared_task(retry_backoff=1, retry_jitter=False)
def fail_then_ok(times: int = 2):
    """Raise ``RetryableError`` on the first ``times`` attempts, then succeed."""
    append("start")
    job = current_job()
    if job is not None and job.attempt <= int(times):
        raise RetryableError(f"nemesis: failing attempt {job.attempt} of {times}")
    append("end")


@shared_task(retry_backoff=1, retry_jitter=False)
def always_fail():
    """Raise ``RetryableError`` every time: the job ends ``failed`` after its max_retries."""
    append("start")
    raise RetryableError("nemesis: always failing")


@shared_task
def long(seconds: float = 8.0):
    """Run ``seconds`` (longer than RUN_LEASE: the heartbeat keeps the lease), stop early when cancelled."""
    append("start")
    deadline = time.monotonic() + float(seconds)
    while time.monotonic() < deadline:
        job = current_job()
        if job is not None and job.cancel_requested:
            return "cancelled"
        time.sleep(0.1)
    append("end")
    return "done"
