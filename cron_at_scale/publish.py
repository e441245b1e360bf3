"""Publishing claimed attempts to the Celery broker.

Each attempt becomes an ordinary Celery task message (protocol 2) with task
id ``"<job id>:<attempt>"`` and a ``cron_at_scale`` header carrying the job
id, the attempt number and the occurrence's scheduled time, which the worker
middleware reads. One producer (one broker connection) serves a whole batch.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from celery import Celery

from .models import task_id_for

log = logging.getLogger(__name__)

HEADER = "cron_at_scale"


@dataclass(frozen=True)
class Claimed:
    """One claimed run, as the claim statement returned it."""

    job_id: Any
    attempt: int  # for a recurring job as claimed: its attempt counter before this claim
    fire_at: datetime
    schedule_type: str
    cron_expr: str
    timezone: str
    task: str
    payload: dict
    queue: str
    options: dict
    occurrence: datetime | None = None  # a recurring run's nominal occurrence (fire_at minus jitter)

    @property
    def attempts(self) -> int:
        return self.attempt

    @classmethod
    def from_row(cls, row) -> Claimed:
        # Django's PostgreSQL backend hands jsonb to raw cursors as text.
        payload, options = row[7], row[9]
        if isinstance(payload, str):
            payload = json.loads(payload)
        if isinstance(options, str):
            options = json.loads(options)
        return cls(*row[:7], payload, row[8], options)


def header(c: Claimed) -> dict:
    """The ``cron_at_scale`` message header: which run this is. ``fire_at``: when it was due;
    ``occurrence``: the schedule's nominal time of a recurring run (``fire_at`` without jitter)."""
    return {"job_id": str(c.job_id), "attempt": c.attempt, "fire_at": c.fire_at.isoformat(),
            "occurrence": (c.occurrence or c.fire_at).isoformat()}


def publish_batch(app: Celery, batch: list[Claimed]) -> int:
    """Send every claimed run in ``batch`` to the broker; return how many were sent.

    A run that cannot be sent stays claimed; its dispatch lease expires and
    the reaper fires it again (the database, not the broker, is the truth).
    """
    sent = 0
    with app.producer_or_acquire() as producer:
        for c in batch:
            options = {"priority": c.options["priority"]} if "priority" in (c.options or {}) else {}
            app.send_task(
                c.task,
                args=c.payload.get("args", ()),
                kwargs=c.payload.get("kwargs", {}),
                task_id=task_id_for(c.job_id, c.attempt),
                queue=c.queue or None,
                headers={HEADER: header(c)},
                producer=producer,
                **options,
            )
            sent += 1
    return sent
