"""Retention: finished jobs and their attempts go after an age, in batches; everything else stays."""

from __future__ import annotations

import pytest
from demo.tasks import noop
from helpers import sql

import cron_at_scale
from cron_at_scale.maintenance import retention
from cron_at_scale.models import Job, JobAttempt

pytestmark = pytest.mark.django_db
DAY = 86400


def job(status: str, age_days: float, attempts: int = 1, open_attempt: bool = False) -> Job:
    j = cron_at_scale.schedule(noop)
    sql("UPDATE cron_at_scale_job SET status = %s, updated_at = now() - make_interval(days => %s) WHERE id = %s",
        [status, age_days, j.id])
    for n in range(1, attempts + 1):
        finished = None if open_attempt and n == attempts else "now()"
        sql(f"INSERT INTO cron_at_scale_jobattempt (job_id, attempt, scheduled_at, finished_at, outcome) "
            f"VALUES (%s, %s, now(), {finished or 'NULL'}, 'succeeded')", [j.id, n])
    return j


def test_purge_deletes_old_finished_jobs_and_their_attempts_only():
    old_done = [job("completed", 8, attempts=3) for _ in range(5)]
    old_cancelled = job("cancelled", 9)
    kept = [job("completed", 1), job("failed", 30), job("pending", 30), job("paused", 30),
            job("in_progress", 30), job("cancelled", 30, attempts=2, open_attempt=True)]
    assert retention.purge(7 * DAY, batch_size=2, dry_run=True) == (7, 17)
    assert Job.objects.count() == 12  # a dry run deletes nothing
    jobs, attempts = retention.purge(7 * DAY, batch_size=2)
    # The old cancelled job whose last run is still open loses its finished attempt, keeps its row and open one.
    assert (jobs, attempts) == (6, 17)
    gone = {j.id for j in old_done} | {old_cancelled.id}
    assert not Job.objects.filter(id__in=gone).exists()
    assert not JobAttempt.objects.filter(job_id__in=gone).exists()
    assert set(Job.objects.values_list("id", flat=True)) == {j.id for j in kept}
    assert JobAttempt.objects.filter(job_id=kept[-1].id).count() == 1
    assert retention.purge(7 * DAY) == (0, 0)


def test_purge_refuses_bad_input():
    with pytest.raises(ValueError):
        retention.purge(-1)
    with pytest.raises(ValueError):
        retention.purge(60, batch_size=0)


def test_maybe_purge_keeps_30_days_by_default_none_keeps_all_and_runs_at_most_once_per_interval(settings):
    settings.CRON_AT_SCALE = {}  # RETENTION unset: 30 days
    month_old, recent = job("completed", 31), job("completed", 10)
    loop = retention.Retention()  # a dispatcher's: the timer is its own
    assert loop.maybe_run(now=1e9 - 1000) == (1, 1)
    assert set(Job.objects.values_list("id", flat=True)) == {recent.id} != {month_old.id}
    settings.CRON_AT_SCALE = {"RETENTION": None}  # kept forever
    assert retention.Retention().maybe_run(now=1e9) == (0, 0)
    assert Job.objects.count() == 1
    settings.CRON_AT_SCALE = {"RETENTION": 7 * DAY}
    assert loop.maybe_run(now=1e9) == (1, 1)
    job("completed", 10)
    assert loop.maybe_run(now=1e9 + 1) == (0, 0)  # within RETENTION_INTERVAL
    assert loop.maybe_run(now=1e9 + retention.RETENTION_INTERVAL + 1) == (1, 1)


def test_a_purge_that_falls_behind_comes_back_after_its_budget_not_its_interval(settings):
    """Jobs finishing faster than one pass a minute purges: a pass that stops on its budget with
    more left is followed by another after about as long as it took, until it has caught up."""
    settings.CRON_AT_SCALE = {"RETENTION": 7 * DAY}
    for _ in range(3 * retention.DEFAULT_BATCH_SIZE // 1000 + 1):
        cron_at_scale.schedule_many([{"task": "demo.tasks.noop"} for _ in range(1000)])
    sql("UPDATE cron_at_scale_job SET status = 'completed', updated_at = now() - interval '8 days'")
    total = Job.objects.count()
    loop = retention.Retention(budget=0.0)  # every pass stops after its first chunk
    assert loop.maybe_run(now=1e9) == (retention.DEFAULT_BATCH_SIZE, 0)
    assert loop.behind and loop._next < 1e9 + 1.0  # noqa: SLF001 (its own timer)
    passes = 1
    while loop.behind:
        passes += 1
        loop.maybe_run(now=loop._next)  # noqa: SLF001
    n = -(-total // retention.DEFAULT_BATCH_SIZE)
    assert Job.objects.count() == 0 and passes in (n, n + 1)  # (+1: a last full chunk, then an empty one)
    assert loop._next >= 1e9 + retention.RETENTION_INTERVAL - 5.0  # noqa: SLF001 (caught up: a minute again)
