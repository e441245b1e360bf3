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


def test_maybe_purge_is_off_by_default_and_runs_at_most_once_per_interval(settings):
    job("completed", 10)
    loop = retention.Retention()  # a dispatcher's: the timer is its own
    assert loop.maybe_run(now=1e9) == (0, 0)  # RETENTION unset: off
    assert Job.objects.count() == 1
    settings.CRON_AT_SCALE = {"RETENTION": 7 * DAY}
    assert loop.maybe_run(now=1e9) == (1, 1)
    job("completed", 10)
    assert loop.maybe_run(now=1e9 + 1) == (0, 0)  # within RETENTION_INTERVAL
    assert loop.maybe_run(now=1e9 + retention.RETENTION_INTERVAL + 1) == (1, 1)
