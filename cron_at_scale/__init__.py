"""cron_at_scale: scheduled, delayed and cron jobs for Django + Celery, stored in PostgreSQL.

Public API (see the README)::

    from cron_at_scale import schedule, reschedule, schedule_many, cancel, JobTask, RetryableError, current_job

The scheduling functions are imported lazily so that importing this package
does not need Django's app registry to be ready.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from cron_at_scale import compat
from cron_at_scale.exceptions import KeyConflict, RetryableError, ValidationError

compat.install()

if TYPE_CHECKING:  # at run time they come from __getattr__, once Django's app registry is ready
    from cron_at_scale.models import Job
    from cron_at_scale.worker.task import JobTask, current_job

__all__ = [
    "schedule",
    "schedule_many",
    "reschedule",
    "cancel",
    "requeue",
    "pause",
    "resume",
    "JobTask",
    "RetryableError",
    "ValidationError",
    "KeyConflict",
    "current_job",
]

__version__ = "0.1.0"


# The wrappers repeat the signatures of cron_at_scale.api.schedule (tests/unit/test_cron_at_scale.py checks they agree).


def schedule(task: Any, *, update: bool = False, **spec: Any) -> Job:
    """Schedule one job; see :func:`cron_at_scale.api.schedule.schedule`."""
    from cron_at_scale.api.schedule import schedule as _schedule

    return _schedule(task, update=update, **spec)


def reschedule(job_or_key: Any, **changes: Any) -> Job:
    """Change a stored job in place; see :func:`cron_at_scale.api.schedule.reschedule`."""
    from cron_at_scale.api.schedule import reschedule as _reschedule

    return _reschedule(job_or_key, **changes)


def schedule_many(specs: Iterable[Mapping[str, Any]], *, batch_size: int = 10_000) -> list[Job]:
    """Schedule many jobs in bulk; see :func:`cron_at_scale.api.bulk.schedule_many`."""
    from cron_at_scale.api.bulk import schedule_many as _schedule_many

    return _schedule_many(specs, batch_size=batch_size)


def cancel(job_id: uuid.UUID | str) -> bool:
    """Cancel a job unless finished; see :func:`cron_at_scale.api.control.cancel`."""
    from cron_at_scale.api.control import cancel as _cancel

    return _cancel(job_id)


def requeue(job_id: uuid.UUID | str | None = None, *, task: str | None = None, queue: str | None = None,
            failed_after: datetime | None = None, failed_before: datetime | None = None,
            all_failed: bool = False, batch_size: int = 1000) -> int:
    """Put failed jobs back to pending; see :func:`cron_at_scale.api.control.requeue`."""
    from cron_at_scale.api.control import requeue as _requeue

    return _requeue(job_id, task=task, queue=queue, failed_after=failed_after, failed_before=failed_before,
                    all_failed=all_failed, batch_size=batch_size)


def pause(job_id: uuid.UUID | str, note: str = "") -> bool:
    """Hold a recurring job; see :func:`cron_at_scale.api.control.pause`."""
    from cron_at_scale.api.control import pause as _pause

    return _pause(job_id, note)


def resume(job_id: uuid.UUID | str, missed: str | None = None) -> bool:
    """Resume a paused job; see :func:`cron_at_scale.api.control.resume`."""
    from cron_at_scale.api.control import resume as _resume

    return _resume(job_id, missed)


def __getattr__(name: str) -> Any:
    if name in ("JobTask", "current_job"):
        from cron_at_scale.worker import task as worker

        return getattr(worker, name)
    if name in compat.MOVED:
        return compat.load(name)
    raise AttributeError(f"module 'cron_at_scale' has no attribute {name!r}")
