"""Bounded run history: a recurring job keeps its latest attempts, not every attempt it ever made.

A per-second job adds 86,400 attempt rows a day, and its job never finishes, so retention
(:mod:`cron_at_scale.maintenance.retention`, finished jobs only) never deletes them. Here, each
recurring job keeps its latest ``HISTORY_PER_JOB`` attempts (default 1000) and, with
``HISTORY_MAX_AGE`` seconds set, none dispatched longer ago; never its latest attempt, never
an unfinished one (``dispatched``, ``running``: the reaper and the workers need them).

Nothing counts attempt rows: the job row's counters (``attempts``, ``lost_attempts``,
``missed_occurrences``, ``skipped_occurrences``, ``last_success_at``) are kept by the
statements that change them, and the reaper's re-fire limit is carried from attempt to
attempt (``occurrence_losses``). So trimming changes no figure but the rows shown.

:class:`HistoryTrim` is the dispatcher's loop (a :class:`~cron_at_scale.maintenance.loop.Loop`),
run on its maintenance thread: every ``TRIM_INTERVAL``
seconds one statement finds the jobs to trim (an index probe per recurring job: the
oldest attempt), then deletes their extra rows oldest first, ``batch_size`` rows of up to
``JOBS_PER_STATEMENT`` jobs per statement, each its own short transaction (asynchronous
commit: a lost delete is done again), for at most ``TRIM_BUDGET`` seconds. Rows another
session holds are skipped (``SKIP LOCKED``): dispatchers trimming at once neither wait for
nor delete the same rows. Between two passes a job gains what it fires in ``TRIM_INTERVAL``
seconds: a per-second job keeps at most ``HISTORY_PER_JOB`` + ~10 rows (+ its unfinished ones).
"""

from __future__ import annotations

import logging
import random
import time

from cron_at_scale import conf
from cron_at_scale import sql as db
from cron_at_scale.maintenance.loop import Loop

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 1000  # rows per delete: a few ms of locks
JOBS_PER_STATEMENT = 100  # jobs per delete statement: one statement a pass in the steady state
TRIM_INTERVAL = 10.0  # seconds between a dispatcher's passes
TRIM_BUDGET = 0.5  # seconds of deleting per pass, so the claim loop is never held up long


def settings() -> tuple[int | None, float | None]:
    """``(HISTORY_PER_JOB, HISTORY_MAX_AGE)``; None: that limit is off."""
    keep, age = conf.get("HISTORY_PER_JOB"), conf.get("HISTORY_MAX_AGE")
    return (None if keep is None else int(keep)), (None if age is None else float(age))


def trim(keep: int | None, max_age: float | None = None, batch_size: int = DEFAULT_BATCH_SIZE,
         budget_seconds: float | None = None) -> int:
    """Delete the finished attempts of recurring jobs beyond their latest ``keep`` or dispatched more
    than ``max_age`` seconds ago (database clock); never a job's latest attempt. Returns the rows deleted.

    ``None`` turns a limit off (both None: nothing to do). ``budget_seconds``: stop after the
    statement that crosses it (None: run to the end). Raises ``ValueError`` for ``keep`` < 1,
    ``max_age`` <= 0 or ``batch_size`` < 1, and Django's database errors.
    """
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        raise ValueError(f"keep must be a whole number >= 1 or None, got {keep!r}")
    if max_age is not None and (isinstance(max_age, bool) or not isinstance(max_age, (int, float)) or max_age <= 0):
        raise ValueError(f"max_age must be seconds > 0 or None, got {max_age!r}")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a whole number >= 1, got {batch_size!r}")
    if keep is None and max_age is None:
        return 0
    deadline = None if budget_seconds is None else time.monotonic() + budget_seconds
    limits = {"keep": keep, "age": None if max_age is None else float(max_age)}
    deleted = 0
    jobs = db.run("history_due", limits, retries=0)
    random.shuffle(jobs)  # a pass cut short by its budget starts elsewhere next time: no job starves
    for start in range(0, len(jobs), JOBS_PER_STATEMENT):
        chunk = jobs[start : start + JOBS_PER_STATEMENT]
        params = {**limits, "job_ids": [j.id for j in chunk], "latests": [j.attempts for j in chunk], "n": batch_size}
        while True:
            n = db.run("history_trim", params, fetch="count", retries=0)
            deleted += n
            if n < batch_size or (deadline is not None and time.monotonic() > deadline):
                break
        if deadline is not None and time.monotonic() > deadline:
            break
    if deleted:
        log.info("trimmed %d attempts of recurring jobs (keep %s, max age %s s)", deleted, keep, max_age)
    return deleted


class HistoryTrim(Loop):
    """The dispatcher's loop, on its maintenance thread: trims with the ``HISTORY_PER_JOB`` and
    ``HISTORY_MAX_AGE`` settings (read at each pass) at most every ``interval`` seconds
    (``TRIM_INTERVAL``), for at most ``budget`` seconds (``TRIM_BUDGET``). ``maybe_run()``
    returns the rows deleted."""

    name = "history trim"
    idle = 0
    idle_only = True  # trimming never holds up a busy loop

    def __init__(self, interval: float = TRIM_INTERVAL, budget: float = TRIM_BUDGET) -> None:
        super().__init__(interval)
        self.budget = budget

    def run_once(self) -> int:
        keep, max_age = settings()
        return trim(keep, max_age, budget_seconds=self.budget)
