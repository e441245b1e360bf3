"""cron_at_scale: scheduled, delayed and cron jobs for Django + Celery, stored in PostgreSQL.

Public API (see the README)::

    from cron_at_scale import schedule, schedule_many, cancel, JobTask, RetryableError, current_job

The scheduling functions are imported lazily so that importing this package
does not need Django's app registry to be ready.
"""

from __future__ import annotations

from typing import Any

from .exceptions import RetryableError, ValidationError

__all__ = [
    "schedule",
    "schedule_many",
    "cancel",
    "requeue",
    "pause",
    "resume",
    "JobTask",
    "RetryableError",
    "ValidationError",
    "current_job",
]

__version__ = "0.1.0"


def schedule(task: Any, **spec: Any):
    """Schedule one job; see :func:`cron_at_scale.scheduling.schedule`."""
    from .scheduling import schedule as _schedule

    return _schedule(task, **spec)


def schedule_many(specs, **kw: Any):
    """Schedule many jobs in bulk; see :func:`cron_at_scale.bulk.schedule_many`."""
    from .bulk import schedule_many as _schedule_many

    return _schedule_many(specs, **kw)


def cancel(job_id) -> bool:
    """Cancel a job unless finished; see :func:`cron_at_scale.control.cancel`."""
    from .control import cancel as _cancel

    return _cancel(job_id)


def requeue(job_id=None, **filters: Any) -> int:
    """Put failed jobs back to pending; see :func:`cron_at_scale.control.requeue`."""
    from .control import requeue as _requeue

    return _requeue(job_id, **filters)


def pause(job_id, note: str = "") -> bool:
    """Hold a recurring job; see :func:`cron_at_scale.control.pause`."""
    from .control import pause as _pause

    return _pause(job_id, note)


def resume(job_id) -> bool:
    """Resume a paused job; see :func:`cron_at_scale.control.resume`."""
    from .control import resume as _resume

    return _resume(job_id)


def __getattr__(name: str):
    if name in ("JobTask", "current_job"):
        from . import worker

        return getattr(worker, name)
    raise AttributeError(f"module 'cron_at_scale' has no attribute {name!r}")
