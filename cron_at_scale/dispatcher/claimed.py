"""The claim's row type: one claimed run, as the claim (or the reaper's re-fire) returned it; and the
runs among them past their expiry, written skipped before anything is published."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cron_at_scale import sql as db
from cron_at_scale.policy import expiry

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)  # slots: a pre-loaded burst holds a hundred thousand of them
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
    eta: datetime | None = None  # published before its fire_at (ETA_LEAD): Celery's eta, its fire_at
    # (Redis list, message) built while the run was held (Publisher.prepare): at its time, only sent
    envelope: tuple[str, str] | None = None

    @classmethod
    def from_row(cls, row, attempt: int | None = None, fire_at: datetime | None = None,
                 occurrence: datetime | None = None) -> Claimed:
        """A run from a row of ``claim`` or ``refire_cron`` (columns by name); ``attempt``,
        ``fire_at`` and ``occurrence``, when given, instead of the row's (a recurring job's run)."""
        # Django's PostgreSQL backend hands jsonb to raw cursors as text.
        payload, options = row.payload, row.options
        if isinstance(payload, str):
            payload = json.loads(payload)
        if isinstance(options, str):
            options = {} if options == "{}" else json.loads(options)
        return cls(row.id, row.attempts if attempt is None else attempt, row.fire_at if fire_at is None else fire_at,
                   row.schedule_type, row.cron_expr, row.timezone, row.task, payload, row.queue, options, occurrence)


    def with_eta(self) -> Claimed:
        """This run published ahead of its ``fire_at``: Celery's eta set to it (``replace`` costs
        ~14 µs a run, a burst's hundred thousand runs 1.4 s)."""
        return Claimed(self.job_id, self.attempt, self.fire_at, self.schedule_type, self.cron_expr, self.timezone,
                       self.task, self.payload, self.queue, self.options, self.occurrence, self.fire_at)

    def prepared(self, envelope: tuple[str, str]) -> Claimed:
        """This run with its message built (``envelope``: the Redis list and the message)."""
        return Claimed(self.job_id, self.attempt, self.fire_at, self.schedule_type, self.cron_expr, self.timezone,
                       self.task, self.payload, self.queue, self.options, self.occurrence, self.eta, envelope)


def drop_expired(runs: Sequence[Claimed], db_now: datetime) -> list[Claimed]:
    """``runs`` (claimed or re-fired, their attempts ``dispatched``) without those past their
    expiry at ``db_now``; those are written skipped (``expire_runs``) and never published.

    Run inside the claim's (or the reaper's) transaction. A job without ``expires`` costs one
    dictionary test per run.
    """
    gone = [r for r in runs if r.options and expiry.FIELD in r.options and expiry.is_expired(r.options, r.fire_at, db_now)]
    if not gone:
        return list(runs)
    db.run("expire_runs", {"job_ids": [r.job_id for r in gone], "attempts": [r.attempt for r in gone]},
           fetch="count", retries=0)
    log.warning("%d runs past their expiry not published (skipped, counted in expired_runs): %s", len(gone),
                ", ".join(f"{r.job_id}:{r.attempt}" for r in gone[:10]))
    dropped = {(r.job_id, r.attempt) for r in gone}
    return [r for r in runs if (r.job_id, r.attempt) not in dropped]
