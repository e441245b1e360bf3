"""Bounded run history (cron_at_scale.maintenance.history), in process on PostgreSQL.

Time is moved by moving the jobs' times into the past (as tests/integration/test_dispatcher_advance.py
does), never by sleeping.
"""

from __future__ import annotations

import pytest
from demo.tasks import noop
from helpers import YEARLY, RecordingPublisher, due, sql

import cron_at_scale
from cron_at_scale.dispatcher import Dispatcher
from cron_at_scale.maintenance import history
from cron_at_scale.models import Job, JobAttempt

pytestmark = pytest.mark.django_db


def add_attempts(job, n: int, minutes_apart: float = 1.0, open_attempts=()) -> None:
    """``n`` attempt rows for ``job`` (finished, succeeded; those in ``open_attempts`` unfinished),
    the latest dispatched now, each ``minutes_apart`` before the next; the job's counter says ``n``."""
    sql("INSERT INTO cron_at_scale_jobattempt (job_id, attempt, scheduled_at, dispatched_at, finished_at, outcome) "
        "SELECT %s, g, statement_timestamp() - make_interval(secs => (%s - g) * %s * 60.0), "
        "statement_timestamp() - make_interval(secs => (%s - g) * %s * 60.0), "
        "CASE WHEN g = ANY(%s) THEN NULL ELSE statement_timestamp() END, "
        "CASE WHEN g = ANY(%s) THEN 'running' ELSE 'succeeded' END "
        "FROM generate_series(1, %s) AS g",
        [job.id, n, minutes_apart, n, minutes_apart, list(open_attempts), list(open_attempts), n])
    sql("UPDATE cron_at_scale_job SET attempts = %s, lost_attempts = 2, missed_occurrences = 3, "
        "skipped_occurrences = 4 WHERE id = %s", [n, job.id])


def attempt_numbers(job) -> list[int]:
    return list(JobAttempt.objects.filter(job_id=job.id).order_by("attempt").values_list("attempt", flat=True))


def counters(job) -> tuple:
    return Job.objects.filter(id=job.id).values_list(
        "attempts", "lost_attempts", "missed_occurrences", "skipped_occurrences", "last_success_at").get()


@pytest.mark.parametrize("batch_size", [1000, 7])
def test_trim_keeps_the_latest_attempts_never_an_unfinished_one_and_no_counter_moves(batch_size):
    job = cron_at_scale.schedule(noop, cron="* * * * * *")
    once = cron_at_scale.schedule(noop)  # one-off jobs are retention's, never trimmed
    add_attempts(job, 50, open_attempts=[3])
    add_attempts(once, 20)
    before = counters(job)
    assert history.trim(10, batch_size=batch_size) == 39
    assert attempt_numbers(job) == [3, *range(41, 51)]
    assert counters(job) == before
    assert len(attempt_numbers(once)) == 20
    assert history.trim(10, batch_size=batch_size) == 0  # nothing left to do


def test_trim_by_age_keeps_the_latest_attempt_whatever_its_age():
    job = cron_at_scale.schedule(noop, cron="* * * * * *")
    add_attempts(job, 10)  # attempt g dispatched 10 - g minutes ago
    assert history.trim(None, max_age=330) == 4  # 9, 8, 7, 6 minutes ago
    assert attempt_numbers(job) == [5, 6, 7, 8, 9, 10]
    quiet = cron_at_scale.schedule(noop, cron=YEARLY)
    add_attempts(quiet, 3)
    sql("UPDATE cron_at_scale_jobattempt SET dispatched_at = dispatched_at - interval '1 day' WHERE job_id = %s",
        [quiet.id])
    assert history.trim(None, max_age=90) == 4 + 2  # job: 5 to 2 minutes ago; quiet: all but its latest
    assert attempt_numbers(job) == [9, 10]
    assert attempt_numbers(quiet) == [3]


def test_the_refire_limit_and_the_counters_are_the_same_when_the_lost_attempts_were_trimmed(monkeypatch):
    d = Dispatcher(name="t", lease=30, lookahead=0, publisher=RecordingPublisher())
    d.max_lost = 2

    def lose_every_run(trimmed: bool):
        job = cron_at_scale.schedule(noop, cron=YEARLY)
        due(job, 1)
        d.claim()
        for _ in range(3):  # each run starts, then its worker dies (the lease expires)
            sql("UPDATE cron_at_scale_jobattempt SET started_at = statement_timestamp(), outcome = 'running', "
                "locked_until = statement_timestamp() - interval '1 second' WHERE job_id = %s "
                "AND finished_at IS NULL", [job.id])
            d.reap()
            if trimmed:
                history.trim(1)  # the lost attempts are trimmed away: nothing may count them
        return job, list(JobAttempt.objects.filter(job_id=job.id).order_by("attempt").values_list("outcome", flat=True))

    kept, kept_outcomes = lose_every_run(trimmed=False)
    trimmed, trimmed_outcomes = lose_every_run(trimmed=True)
    assert kept_outcomes == ["lost", "lost"]  # the occurrence lost 2 runs: not fired a third time
    assert trimmed_outcomes == ["lost"]  # its latest attempt only
    assert counters(trimmed) == counters(kept)
