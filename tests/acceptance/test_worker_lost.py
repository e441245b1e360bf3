"""A run that kills its pool process fails with its real cause, by its own retry policy, at once.

Real ``celery worker`` (prefork) and dispatcher processes. RUN_LEASE keeps its
default (60 s): everything here must happen long before a lease could expire,
so nothing may be left to the reaper (no attempt ``lost``).
"""

from __future__ import annotations

import time

import pytest
from demo.models import Execution
from demo.runner import wait_for_workers
from helpers import drain_dlq, wait_until

import cron_at_scale
from cron_at_scale.models import Job, JobAttempt

pytestmark = pytest.mark.acceptance

KILLED = "billiard.exceptions.WorkerLostError: worker process exited by signal 9 (SIGKILL)"
TIMED_OUT = "billiard.exceptions.TimeLimitExceeded: hard time limit (2s) exceeded"


def attempts(job):
    return list(JobAttempt.objects.filter(job_id=job.id).order_by("attempt"))


def settle(jobs: dict, timeout: float, what: str):
    """Wait until each job reaches its expected status; return the seconds it took."""
    t0 = time.monotonic()
    wait_until(lambda: all(Job.objects.get(id=j.id).status == want for j, want in jobs.values()),
               timeout=timeout, what=what)
    return time.monotonic() - t0


def check_run_time(rows, low: float, high: float):
    """Each failed run ended ``low``..``high`` seconds after it started (database clock): when its
    process died, not a lease later."""
    for a in rows:
        if a.outcome in ("failed", "retried"):
            took = (a.finished_at - a.started_at).total_seconds()
            assert low <= took <= high, (a.attempt, a.outcome, took)


def start(system):
    drain_dlq(system.app)
    system.worker("w1", concurrency=2)
    system.dispatcher("d1")
    wait_for_workers(system.app, ["w1"])


def test_a_run_that_sigkills_its_process_fails_with_that_cause_by_its_retry_policy(system):
    start(system)
    jobs = {
        "no_retry": (cron_at_scale.schedule("demo.tasks.kill_self", max_retries=0), "failed"),
        "one_retry": (cron_at_scale.schedule("demo.tasks.kill_self", max_retries=1), "failed"),
        "then_ok": (cron_at_scale.schedule("demo.tasks.kill_self", kwargs={"times": 1}, max_retries=1), "completed"),
    }
    settle(jobs, timeout=40, what="the jobs whose runs kill their process to settle (long before RUN_LEASE, 60 s)")
    got = {name: attempts(job) for name, (job, _) in jobs.items()}
    assert [a.outcome for a in got["no_retry"]] == ["failed"]  # max_retries=0: one run
    assert [a.outcome for a in got["one_retry"]] == ["retried", "failed"]  # max_retries=1: two runs
    assert [a.outcome for a in got["then_ok"]] == ["retried", "succeeded"]
    for name in ("no_retry", "one_retry"):
        assert all(a.error == KILLED for a in got[name]), [a.error for a in got[name]]
    assert got["then_ok"][0].error == KILLED
    assert "pool process" in got["no_retry"][0].traceback and got["no_retry"][0].worker in got["no_retry"][0].traceback
    for rows in got.values():
        check_run_time(rows, 0.0, 5.0)
    # ... and bounded by the job's policy, not MAX_LOST_ATTEMPTS: nothing lost, no lost attempt counted
    assert not JobAttempt.objects.filter(job_id__in=[j.id for j, _ in jobs.values()], outcome="lost").exists()
    assert {Job.objects.get(id=j.id).lost_attempts for j, _ in jobs.values()} == {0}
    assert Execution.objects.filter(job_id=jobs["then_ok"][0].id).count() == 1
    # The failed one-off jobs are on the dead-letter queue, once each, with their cause.
    dead = drain_dlq(system.app, timeout=3)
    by_job = {m["job_id"]: m for m in dead}
    assert len(dead) == 2 and set(by_job) == {str(jobs["no_retry"][0].id), str(jobs["one_retry"][0].id)}, dead
    assert by_job[str(jobs["one_retry"][0].id)] == {"job_id": str(jobs["one_retry"][0].id), "attempt": 2,
                                                    "task": "demo.tasks.kill_self", "error": KILLED}


def test_a_run_past_its_hard_time_limit_fails_with_that_cause_retried_only_if_the_task_retries_it(system):
    start(system)
    jobs = {
        # a hard time limit is a failure of the task (Celery's meaning): not retried by default ...
        "default": (cron_at_scale.schedule("demo.tasks.over_time_limit", max_retries=1), "failed"),
        # ... unless the job's (or task's) policy retries every exception, or its autoretry_for covers it
        "no_retry": (cron_at_scale.schedule("demo.tasks.over_time_limit", max_retries=0,
                                            retry_all_exceptions=True), "failed"),
        "one_retry": (cron_at_scale.schedule("demo.tasks.over_time_limit", max_retries=1,
                                             retry_all_exceptions=True), "failed"),
        "then_ok": (cron_at_scale.schedule("demo.tasks.over_time_limit", kwargs={"times": 1}, max_retries=1,
                                           retry_all_exceptions=True), "completed"),
    }
    settle(jobs, timeout=45, what="the jobs whose runs pass their hard time limit to settle (before RUN_LEASE)")
    got = {name: attempts(job) for name, (job, _) in jobs.items()}
    assert [a.outcome for a in got["default"]] == ["failed"]
    assert [a.outcome for a in got["no_retry"]] == ["failed"]
    assert [a.outcome for a in got["one_retry"]] == ["retried", "failed"]
    assert [a.outcome for a in got["then_ok"]] == ["retried", "succeeded"]
    for name in ("default", "no_retry", "one_retry"):
        assert all(a.error == TIMED_OUT for a in got[name]), [a.error for a in got[name]]
    assert got["then_ok"][0].error == TIMED_OUT
    for rows in got.values():
        check_run_time(rows, 1.0, 8.0)  # the 2 s limit (counted from before the start), then recorded at once
    assert not JobAttempt.objects.filter(job_id__in=[j.id for j, _ in jobs.values()], outcome="lost").exists()
    assert Execution.objects.filter(job_id=jobs["then_ok"][0].id).count() == 1
    dead = {m["job_id"]: m for m in drain_dlq(system.app, timeout=3)}
    assert set(dead) == {str(jobs[n][0].id) for n in ("default", "no_retry", "one_retry")}, dead
    assert {m["error"] for m in dead.values()} == {TIMED_OUT}


def test_a_recurring_run_that_kills_its_process_is_recorded_failed_and_the_schedule_goes_on(system):
    start(system)
    job = cron_at_scale.schedule("demo.tasks.kill_self", kwargs={"times": 1}, cron="* * * * * *", max_retries=3)
    wait_until(lambda: JobAttempt.objects.filter(job_id=job.id, outcome="succeeded").exists(), timeout=30,
               what="a later occurrence to succeed")
    cron_at_scale.cancel(job.id)
    rows = attempts(job)
    assert rows[0].outcome == "failed" and rows[0].error == KILLED  # a recurring run is not retried: recorded
    check_run_time(rows[:1], 0.0, 5.0)
    assert "lost" not in {a.outcome for a in rows}
    assert not [m for m in drain_dlq(system.app, timeout=1) if m["job_id"] == str(job.id)]  # no DLQ for a run
