"""Has it run? A dead man's switch per recurring job.

The rule (one SQL expression, in ``sql/maintenance.sql``: ``overdue_jobs``): a recurring job
(cron or interval) is **overdue** when it is ``pending`` (not paused, not ended) and the
occurrence it waits on is more than its grace old (database clock). That occurrence,
``expected_at``, is:

* the first run fired since the job's last success (``due_since``: set when the dispatcher
  fires a run and none is waited on, to that run's time or, if earlier, the occurrence the
  job was due for then (a run fired late, after an outage); cleared by a success for that
  occurrence or a later one), so a task that fails, is lost, or runs longer than the grace
  makes it overdue, and a job that was overdue stays so until a run succeeds;
* else its next occurrence once it is due (the later of ``fire_at`` and ``occurrence_at``),
  so a job nobody fires (no dispatcher, its queue held for want of a worker) is overdue too;
* never earlier than its last ``resume()`` (``resumed_at``).

So: a paused job is not overdue; a job is not overdue before its first occurrence plus the
grace; an occurrence skipped by the overlap policy (its previous run still running) or by the
catch-up policy (nobody fired it in its window) is not waited on, only a run fired is.
A success clears it at once (``start_attempt`` records it: ``last_success_at``,
``last_success_occurrence``). The grace: the job's ``grace`` (``schedule(..., grace=)``), else
the ``OVERDUE_GRACE`` setting (300 s); it must cover the run time and the dispatch lag.

Surfaces: :func:`overdue_jobs` (``cron_status``, the admin), :func:`keyed_health` (the
metrics), and the signals of :mod:`cron_at_scale.signals`, sent by :class:`OverdueWatch`
from the dispatcher's loop: each pass opens the episode of jobs newly overdue (sets
``overdue_since``) and closes the episode of those no longer overdue, one ``UPDATE ...
RETURNING`` each, so that exactly one dispatcher sends each signal. The signal goes out after
that commit: a dispatcher killed in between loses it (at most once per episode).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cron_at_scale import conf
from cron_at_scale import sql as db
from cron_at_scale.maintenance.loop import Loop

log = logging.getLogger(__name__)

CHECK_INTERVAL = 5.0  # seconds between two passes of a dispatcher's watch: the grace is minutes
PASS_LIMIT = 1000  # episodes opened (and closed) per statement; the next pass takes the rest
SHOWN = 100  # overdue jobs listed by cron_status and the dashboard (the count is exact)
MAX_LABELLED = 1000  # keyed recurring jobs given their own metric labels (series) at most


def grace() -> float:
    """The ``OVERDUE_GRACE`` setting, seconds."""
    return float(conf.get("OVERDUE_GRACE"))


@dataclass
class Overdue:
    """An overdue job as :func:`overdue_jobs` lists it (times aware UTC, seconds as floats)."""

    id: str
    key: str | None
    task: str
    expected_at: datetime
    late_seconds: float
    grace: float
    last_success_at: datetime | None
    overdue_since: datetime | None  # None: no dispatcher has opened its episode yet

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "key": self.key, "task": self.task, "expected_at": self.expected_at.isoformat(),
                "late_seconds": round(self.late_seconds, 1), "grace": self.grace,
                "last_success_at": self.last_success_at.isoformat() if self.last_success_at else None,
                "overdue_since": self.overdue_since.isoformat() if self.overdue_since else None}


def overdue_jobs(limit: int = SHOWN) -> tuple[list[Overdue], int]:
    """``(jobs, total)``: the overdue jobs now, most overdue first (at most ``limit``), and how many
    there are. Computed from the rule, not from the dispatchers' episodes: right with no dispatcher."""
    rows = db.run("overdue_jobs", {"grace": grace(), "limit": limit})
    jobs = [Overdue(str(r.id), r.key, r.task, r.expected_at, r.late_seconds, r.grace, r.last_success_at,
                    r.overdue_since) for r in rows]
    return jobs, int(rows[0].total) if rows else 0


def keyed_health(limit: int = MAX_LABELLED) -> list[tuple[str, bool, datetime | None]]:
    """``[(key, overdue, last_success_at)]`` of live (pending or paused) recurring jobs with a key, by
    key, at most ``limit``: the metrics' per-job series (keyless jobs would make a label per id)."""
    return [(r.key, bool(r.overdue), r.last_success_at) for r in db.run("recurring_health",
                                                                          {"grace": grace(), "limit": limit})]


class OverdueWatch(Loop):
    """A dispatcher's watch (a :class:`~cron_at_scale.maintenance.loop.Loop`): every ``interval``
    seconds (``CHECK_INTERVAL``), opens and closes overdue episodes and sends
    :data:`~cron_at_scale.signals.job_overdue` / :data:`~cron_at_scale.signals.job_recovered`."""

    name = "overdue check"
    idle = (0, 0)

    def __init__(self, interval: float | None = None) -> None:
        super().__init__(CHECK_INTERVAL if interval is None else interval)

    def maybe_check(self, now: float | None = None) -> tuple[int, int]:
        """Check if ``interval`` seconds have passed (``now``: monotonic); ``(opened, closed)``.
        Raises the database's connection errors (the loop retries); logs any other error."""
        return self.maybe_run(now)

    def run_once(self) -> tuple[int, int]:
        return self.check()

    def check(self) -> tuple[int, int]:
        """One pass now: ``(episodes opened, episodes closed)``, each signal sent once."""
        from cron_at_scale.models import Job
        from cron_at_scale.signals import job_overdue, job_recovered

        params = {"grace": grace(), "limit": PASS_LIMIT}
        opened = db.run("overdue_open", params, retries=0)
        closed = db.run("overdue_close", params, retries=0)
        if not opened and not closed:
            return 0, 0
        jobs = Job.objects.in_bulk([r.id for r in opened] + [r.id for r in closed])
        for r in opened:
            job = jobs.get(r.id)
            if job is None:
                continue
            log.warning("job %s (%s%s) is overdue: no success for its occurrence of %s, %.0fs ago (grace %.0fs)",
                        job.id, job.task, f", key {job.key}" if job.key else "", r.expected_at.isoformat(),
                        r.late_seconds, r.grace)
            _send(job_overdue, job=job, expected_at=r.expected_at, late_seconds=r.late_seconds, grace=r.grace)
        for r in closed:
            job = jobs.get(r.id)
            if job is None:
                continue
            reason = recovery_reason(r.status, r.overdue_since, r.last_success_at)
            log.warning("job %s (%s) is no longer overdue (%s)", job.id, job.task, reason)
            _send(job_recovered, job=job, overdue_since=r.overdue_since, reason=reason,
                  last_success_at=r.last_success_at)
        return len(opened), len(closed)


def recovery_reason(status: str, overdue_since: datetime, last_success_at: datetime | None) -> str:
    """Why an episode ended: ``succeeded``, ``paused``, ``ended`` or ``not due`` (see the signals)."""
    if last_success_at is not None and last_success_at >= overdue_since:
        return "succeeded"
    if status == "paused":
        return "paused"
    if status != "pending":
        return "ended"
    return "not due"


def _send(signal, **kwargs) -> None:
    from cron_at_scale.models import Job

    for receiver, result in signal.send_robust(sender=Job, **kwargs):
        if isinstance(result, Exception):
            log.error("receiver %r of a cron_at_scale signal raised %r", receiver, result,
                      exc_info=(type(result), result, result.__traceback__))
