"""Receivers of cron_at_scale's overdue signals, for the tests: with ``CRON_SIGNAL_LEDGER`` set
(a file path), each signal a process receives appends one JSON line there (outside the jobs'
database): ``{"signal": "job_overdue"|"job_recovered", "job": uuid, "key": ..., "pid": int, ...}``.
Without it they do nothing."""

from __future__ import annotations

import json
import os

from django.dispatch import receiver

from cron_at_scale.signals import job_overdue, job_recovered


def _append(line: dict) -> None:
    path = os.environ.get("CRON_SIGNAL_LEDGER")
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


@receiver(job_overdue)
def overdue(sender, job, expected_at, late_seconds, grace, **kwargs):
    _append({"signal": "job_overdue", "job": str(job.id), "key": job.key, "pid": os.getpid(),
             "expected_at": expected_at.isoformat(), "late_seconds": late_seconds, "grace": grace})


@receiver(job_recovered)
def recovered(sender, job, overdue_since, reason, last_success_at, **kwargs):
    _append({"signal": "job_recovered", "job": str(job.id), "key": job.key, "pid": os.getpid(),
             "overdue_since": overdue_since.isoformat(), "reason": reason,
             "last_success_at": last_success_at.isoformat() if last_success_at else None})
