"""Moving locked recurring jobs on to their next occurrence, and logging the runs that fire now.

The dispatcher does it for every recurring job a claim locks; ``resume`` (with
``missed=``) and ``reschedule`` do it for the one job they lock, so that what
fell due before their change is decided exactly as a claim would decide it.
The rules themselves are :func:`cron_at_scale.recurrence.plan`'s.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import timedelta

from . import db
from .publish import Claimed
from .recurrence import Recurrence, plan

log = logging.getLogger(__name__)


def advance(rows, *, lease: float, lookahead: float = 0.0, catchup: str | None = None) -> list[Claimed]:
    """Move the recurring jobs of ``rows`` (row-locked, with the columns ``claim`` returns) to
    their next occurrence; return the runs to publish now (their attempts are logged 'dispatched').

    ``lease``: seconds of dispatch lease of each run; ``lookahead``: seconds ahead of the
    database's ``now`` (the rows' ``db_now``) a run may be claimed; ``catchup``: a catch-up
    policy used instead of each job's own (``resume(missed=...)``; ``"none"``: fire none).
    Must run in the transaction that locked the rows.
    """
    moved: dict[str, list] = {k: [] for k in ("ids", "fire_ats", "occurrences", "n_attempts", "missed", "skipped",
                                              "buffers", "first_fired")}
    logged: dict[str, list] = {k: [] for k in ("a_job_ids", "a_attempts", "a_scheduled", "a_outcomes")}
    runs: list[Claimed] = []
    # Read after the claim locked the rows, in a statement of its own (see running_jobs).
    watched = [row.id for row in rows if row.overlap != "allow"]
    busy = {r.job_id for r in db.run("running_jobs", {"ids": watched}, retries=0)} if watched else set()
    for row in rows:
        base = Claimed.from_row(row)
        overlap, buffered_at, db_now = row.overlap, row.buffered_at, row.db_now
        running = base.job_id in busy
        rec = Recurrence(str(base.job_id), base.schedule_type, base.cron_expr, base.timezone, row.interval,
                         row.jitter, catchup or row.catchup, row.catchup_window, overlap)
        occurrence_at = row.occurrence_at or base.fire_at
        if buffered_at is None and base.fire_at < occurrence_at:
            buffered_at = base.fire_at  # fire_at moved before the schedule ("run now"): one extra run
        # Runs due within the look-ahead go to the timers; but whether a run overlaps
        # the previous one is decided when it is due, not a look-ahead early.
        early = lookahead if overlap == "allow" or not running else 0.0
        horizon = db_now + timedelta(seconds=early)
        p = plan(rec, occurrence_at, horizon, running=running, buffered=buffered_at)
        attempt = base.attempt  # the counter before this claim
        for (occ, due_at), outcome in [*((s, "skipped") for s in p.skipped), *((f, "dispatched") for f in p.fire)]:
            attempt += 1
            logged["a_job_ids"].append(base.job_id)
            logged["a_attempts"].append(attempt)
            logged["a_scheduled"].append(due_at)
            logged["a_outcomes"].append(outcome)
            if outcome == "dispatched":
                runs.append(replace(base, attempt=attempt, fire_at=due_at, occurrence=occ))
        first_fired = min((due_at for _occ, due_at in p.fire), default=None)  # the overdue watch
        for key, value in zip(moved, (base.job_id, p.next_fire_at, p.next_occurrence, attempt - base.attempt,
                                      p.missed, len(p.skipped), p.buffer, first_fired), strict=True):
            moved[key].append(value)
        if p.missed or p.skipped:
            log.warning("job %s: %d occurrences missed (catch-up %s, window %.0fs), %d skipped (overlap %s)",
                        base.job_id, p.missed, rec.catchup, row.catchup_window, len(p.skipped), overlap)
    db.run("advance_recurring", {**moved, **logged, "lease": lease}, fetch="count", retries=0)
    return runs
