"""Controls of stored jobs: ``cancel``, ``requeue``, ``pause``, ``resume``.

Each is one statement (or one per batch) on the jobs table, in the caller's
transaction if there is one; a malformed argument raises
:class:`cron_at_scale.ValidationError` and changes nothing.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

from django.db import connection
from django.db.models import Q

from .exceptions import ValidationError
from .models import Job, Status
from .sql import QUERIES
from .validation import check_batch_size, check_text, job_uuid, show


def cancel(job_id: uuid.UUID | str) -> bool:
    """Cancel a job unless it already finished; True if this call cancelled it.

    A pending job will not fire; a claimed one is skipped by the worker; a
    running one sees ``current_job().cancel_requested`` at its next heartbeat.
    Raises ``ValidationError`` (field ``job_id``) for a malformed id.
    """
    with connection.cursor() as cur:
        cur.execute(QUERIES["cancel"], {"job_id": job_uuid(job_id)})
        return cur.fetchone() is not None


def requeue(job_id: uuid.UUID | str | None = None, *, task: str | None = None, queue: str | None = None,
            failed_after: datetime | None = None, failed_before: datetime | None = None,
            all_failed: bool = False, batch_size: int = 1000) -> int:
    """Put failed jobs back to ``pending``, due now, with retries and lost attempts reset.

    One job (``job_id``), or every failed job matching the filters (``task``
    name, ``queue``, failed after/before an aware datetime); with no job id
    and no filter, ``all_failed=True`` is required (so a typo cannot requeue
    a whole dead-letter queue). Returns how many jobs were requeued. A job
    whose idempotency key is held by a live job stays failed.
    Raises ``ValidationError`` for a malformed id or filter.
    """
    check_batch_size(batch_size)
    query = Q(status=Status.FAILED)
    if job_id is not None:
        query &= Q(id=job_uuid(job_id))
    if task is not None:
        query &= Q(task=check_text("task", task, 200))
    if queue is not None:
        query &= Q(queue=check_text("queue", queue, 200))
    for field_name, value, lookup in (("failed_after", failed_after, "gte"), ("failed_before", failed_before, "lt")):
        if value is not None:
            if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
                raise ValidationError(field_name, "must be an aware datetime")
            try:
                value = value.astimezone(timezone.utc)
            except (OverflowError, ValueError):
                raise ValidationError(field_name, f"{show(value)} is out of range once in UTC") from None
            query &= Q(**{f"updated_at__{lookup}": value})
    if job_id is None and task is None and queue is None and failed_after is None and failed_before is None \
            and not all_failed:
        raise ValidationError("job_id", "give a job id, a filter, or all_failed=True")
    ids = list(Job.objects.filter(query).values_list("id", flat=True))
    done = 0
    with connection.cursor() as cur:
        for start in range(0, len(ids), batch_size):
            cur.execute(QUERIES["requeue"], {"job_ids": ids[start : start + batch_size]})
            done += cur.rowcount
    return done


def pause(job_id: uuid.UUID | str, note: str = "") -> bool:
    """Hold a recurring (cron or interval) job; True if this call paused it.

    A run already started goes on. ``note`` (say why) shows in the admin.
    Raises ``ValidationError`` for a malformed id or note.
    """
    if not isinstance(note, str) or len(note) > 2000:
        raise ValidationError("note", "must be a string of at most 2000 characters")
    if note:
        check_text("note", note, 2000)
    with connection.cursor() as cur:
        cur.execute(QUERIES["pause"], {"job_id": job_uuid(job_id), "note": note})
        return cur.fetchone() is not None


def resume(job_id: uuid.UUID | str) -> bool:
    """Resume a paused job; True if this call resumed it. Occurrences that fell
    due while it was paused follow its catch-up policy (``catchup``, ``catchup_window``)."""
    with connection.cursor() as cur:
        cur.execute(QUERIES["resume"], {"job_id": job_uuid(job_id)})
        return cur.fetchone() is not None
