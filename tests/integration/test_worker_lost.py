"""worker_lost.record: which attempt the parent may end when a pool process dies (no worker processes)."""

from __future__ import annotations

import socket

import pytest
from billiard.exceptions import TimeLimitExceeded, WorkerLostError
from demo import tasks as demo_tasks

import cron_at_scale
from cron_at_scale import sql as db
from cron_at_scale.dispatcher import Dispatcher
from cron_at_scale.models import Job, JobAttempt
from cron_at_scale.worker.lost import cause_of, record

pytestmark = pytest.mark.django_db

KILLED = WorkerLostError("Worker exited prematurely: signal 9 (SIGKILL) Job: 3.")


def started(job, pid: int) -> dict:
    """Claim ``job`` and start its attempt as pool process ``pid`` would; its message header."""
    (run,) = [r for r in Dispatcher(name="t", lookahead=0).claim() if r.job_id == job.id]
    db.run("start_attempt", {"job_id": str(job.id), "attempt": run.attempt, "worker": f"{socket.gethostname()}:{pid}", "token": None, "fire_at": None,
                             "lease": 60.0, "done_job_ids": [], "done_attempts": []}, fetch="one")
    return {"job_id": str(job.id), "attempt": run.attempt}


def test_causes_are_readable():
    assert cause_of(KILLED) == ("worker process exited by signal 9 (SIGKILL)", True)
    assert cause_of(WorkerLostError("Worker exited prematurely: exitcode 1 Job: 2.")) == (
        "worker process exited with exit code 1", True)
    assert cause_of(TimeLimitExceeded(2.5)) == ("hard time limit (2.5s) exceeded", False)


def test_the_dead_process_attempt_is_retried_then_failed_by_the_job_policy():
    task = demo_tasks.kill_self
    job = cron_at_scale.schedule(task, max_retries=1)
    assert record(task, started(job, 4242), 4242, KILLED) == "retried"
    Job.objects.filter(id=job.id).update(fire_at=Job.objects.get(id=job.id).created_at)  # skip the backoff
    assert record(task, started(job, 4343), 4343, KILLED) == "failed"
    rows = list(JobAttempt.objects.filter(job_id=job.id).order_by("attempt").values_list("outcome", "error"))
    cause = "billiard.exceptions.WorkerLostError: worker process exited by signal 9 (SIGKILL)"
    assert rows == [("retried", cause), ("failed", cause)]
    job.refresh_from_db()
    assert (job.status, job.retries, job.lost_attempts) == ("failed", 1, 0)


def test_a_hard_time_limit_is_not_retried_unless_the_policy_retries_it():
    task = demo_tasks.over_time_limit
    plain = cron_at_scale.schedule(task, max_retries=3)
    assert record(task, started(plain, 4242), 4242, TimeLimitExceeded(2)) == "failed"
    opted = cron_at_scale.schedule(task, max_retries=3, retry_all_exceptions=True)
    assert record(task, started(opted, 4242), 4242, TimeLimitExceeded(2)) == "retried"


def test_only_an_attempt_still_running_in_that_process_is_touched():
    task = demo_tasks.kill_self
    other = cron_at_scale.schedule(task, max_retries=0)
    meta = started(other, 4242)
    assert record(task, meta, 9999, KILLED) is None  # another process's attempt: not this death's
    assert JobAttempt.objects.get(job_id=other.id).outcome == "running"

    won = cron_at_scale.schedule(task, max_retries=0)
    meta = started(won, 4242)
    db.run("start_attempt", {"job_id": None, "attempt": 0, "worker": "", "token": None, "fire_at": None, "lease": 60.0,  # its success, written first
                             "done_job_ids": [meta["job_id"]], "done_attempts": [meta["attempt"]]}, fetch="one")
    assert record(task, meta, 4242, KILLED) is None
    assert JobAttempt.objects.get(job_id=won.id).outcome == "succeeded"
    assert Job.objects.get(id=won.id).status == "completed"

    never = cron_at_scale.schedule(task, max_retries=0)
    (run,) = [r for r in Dispatcher(name="t", lookahead=0).claim() if r.job_id == never.id]
    assert record(task, {"job_id": str(never.id), "attempt": run.attempt}, 4242, KILLED) is None  # not started
    assert JobAttempt.objects.get(job_id=never.id).outcome == "dispatched"
