"""Moving locked recurring jobs on to their next occurrence, and logging the runs that fire now.

The dispatcher does it for every recurring job a claim locks; ``resume`` (with
``missed=``) and ``reschedule`` do it for the one job they lock, so that what
fell due before their change is decided exactly as a claim would decide it.
The rules themselves are :func:`cron_at_scale.policy.recurrence.plan`'s.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from cron_at_scale import sql as db
from cron_at_scale.dispatcher.claimed import Claimed
from cron_at_scale.policy.recurrence import Occurrences, Plan, Recurrence, plan

log = logging.getLogger(__name__)


def advance(rows, *, lease: float, lookahead: float = 0.0, catchup: str | None = None,
            shared: Occurrences | None = None) -> list[Claimed]:
    """Move the recurring jobs of ``rows`` (row-locked, with the columns ``claim`` returns) to
    their next occurrence; return the runs to publish now (their attempts are logged 'dispatched').

    ``lease``: seconds of dispatch lease of each run; ``lookahead``: seconds ahead of the
    database's ``now`` (the rows' ``db_now``) a run may be claimed; ``catchup``: a catch-up
    policy used instead of each job's own (``resume(missed=...)``; ``"none"``: fire none).
    Must run in the transaction that locked the rows.
    """
    runs: list[Claimed] = []
    if shared is None:  # a burst shares a few expressions: each computed once (a dispatcher keeps one)
        shared = Occurrences()
    # Jobs alike in everything the plan reads (no jitter, which hashes the job id) share one plan,
    # and the statement gets each plan once and each job as (id, plan number): at the top of the
    # hour, thousands of jobs share a few (expression, zone, occurrence).
    by_key: dict[tuple, int] = {}
    plans: list[Plan] = []
    job_ids: list = []
    job_plans: list[int] = []
    parked: list = []
    # Read after the claim locked the rows, in a statement of its own (see running_jobs).
    watched = [row.id for row in rows if row.overlap != "allow"]
    busy = {r.job_id for r in db.run("running_jobs", {"ids": db.array(watched)}, retries=0)} if watched else set()
    for row in rows:
        job_id, overlap, buffered_at, db_now = row.id, row.overlap, row.buffered_at, row.db_now
        running = job_id in busy
        occurrence_at = row.occurrence_at or row.fire_at
        if buffered_at is None and row.fire_at < occurrence_at:
            buffered_at = row.fire_at  # fire_at moved before the schedule ("run now"): one extra run
        # Runs due within the look-ahead go to the timers; but whether a run overlaps
        # the previous one is decided when it is due, not a look-ahead early.
        early = lookahead if overlap == "allow" or not running else 0.0
        policy = catchup or row.catchup
        key = (row.schedule_type, row.cron_expr, row.timezone, row.interval, policy, row.catchup_window, overlap,
               occurrence_at, early, running, buffered_at, row.jitter and job_id)
        index = by_key.get(key)
        if index is None:
            rec = Recurrence(str(job_id), row.schedule_type, row.cron_expr, row.timezone, row.interval,
                             row.jitter, policy, row.catchup_window, overlap)
            p = plan(rec, occurrence_at, db_now, running=running, buffered=buffered_at, shared=shared, lookahead=early)
            index = by_key[key] = len(plans)
            plans.append(p)
            if p.missed or p.skipped:
                # a catch-up the caller chose (resume(missed=...)) is its own report; the job's policy dropping runs is news
                log.log(logging.INFO if catchup else logging.WARNING,
                        "job %s%s: %d occurrence(s) missed (catch-up %s, window %.0fs), %d skipped (overlap %s)",
                        job_id, "" if row.jitter or len(rows) == 1 else " and the jobs alike in this batch", p.missed,
                        policy, row.catchup_window, len(p.skipped), overlap)
        else:
            p = plans[index]
        if (not p.fire and not p.skipped and not p.missed and p.next_fire_at == row.fire_at
                and p.next_occurrence == row.occurrence_at and p.buffer == row.buffered_at):
            # Not due yet, and undecided until it is (an unfinished run, overlap skip/buffer_one):
            # parked (locked_until = its fire_at) so that claims pass it by until then, rather than
            # lock it again at every claim of the look-ahead (a pre-loaded burst would claim
            # nothing else). A changed fire_at (reschedule, run now, a buffered run) unparks it.
            if row.locked_until != row.fire_at:
                parked.append(job_id)
            continue
        job_ids.append(job_id)
        job_plans.append(index)
        if len(p.fire) == 1:
            (occ, due_at), = p.fire
            runs.append(Claimed.from_row(row, row.attempts + len(p.skipped) + 1, due_at, occ))
        elif p.fire:
            base = Claimed.from_row(row)
            first = row.attempts + len(p.skipped)  # the attempt counter before this claim, then the skipped
            runs += [replace(base, attempt=first + k, fire_at=due_at, occurrence=occ)
                     for k, (occ, due_at) in enumerate(p.fire, 1)]
    # Per plan: the job's new columns, and its attempt rows as (plan, offset from the job's
    # counter before this claim, scheduled time, outcome): the skipped first, then the fired.
    attempts: dict[str, list] = {"r_plans": [], "r_offsets": [], "r_scheduled": [], "r_outcomes": []}
    for index, p in enumerate(plans):
        for k, ((_occ, due_at), outcome) in enumerate(
                [*((s, "skipped") for s in p.skipped), *((f, "dispatched") for f in p.fire)], 1):
            attempts["r_plans"].append(index)
            attempts["r_offsets"].append(k)
            attempts["r_scheduled"].append(due_at)
            attempts["r_outcomes"].append(outcome)
    if not job_ids and not parked:
        return runs
    columns = {
        "ids": job_ids, "plans": job_plans, "parked": parked,
        "p_fire_ats": [p.next_fire_at for p in plans], "p_occurrences": [p.next_occurrence for p in plans],
        "p_n_attempts": [len(p.skipped) + len(p.fire) for p in plans], "p_missed": [p.missed for p in plans],
        "p_skipped": [len(p.skipped) for p in plans], "p_buffers": [p.buffer for p in plans],
        "p_first_fired": [min((due_at for _occ, due_at in p.fire), default=None) for p in plans],  # the overdue watch
        **attempts,
    }
    db.run("advance_recurring", {**{k: db.array(v) for k, v in columns.items()}, "lease": lease}, fetch="count",
           retries=0)
    return runs
