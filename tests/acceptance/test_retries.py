"""Retries, dead-lettering and cooperative cancellation with a real celery worker."""

from __future__ import annotations

import json

import pytest
from demo.models import Execution
from demo.runner import wait_for_workers
from helpers import wait_until

import cron_at_scale
from cron_at_scale.models import Job, JobAttempt

pytestmark = pytest.mark.acceptance


def drain_dlq(app, timeout=0.5):
    from cron_at_scale import conf

    bodies = []
    with app.connection_for_read() as conn:
        queue = conn.SimpleQueue(conf.get("DLQ_QUEUE"), serializer="json")
        try:
            while True:
                msg = queue.get(timeout=timeout)
                bodies.append(msg.payload)
                msg.ack()
        except queue.Empty:
            pass
        finally:
            queue.close()
    return bodies


def outcomes(job):
    return list(JobAttempt.objects.filter(job_id=job.id).order_by("attempt").values_list("outcome", flat=True))


def test_every_retry_path_is_a_database_state_then_the_dlq(system):
    drain_dlq(system.app)
    system.worker("w1", concurrency=2)
    system.dispatcher("d1")
    wait_for_workers(system.app, ["w1"])
    autoretry = cron_at_scale.schedule("demo.tasks.flaky", kwargs={"times": 2}, max_retries=3)
    self_retry = cron_at_scale.schedule("demo.tasks.retry_self", kwargs={"times": 1})
    per_job = cron_at_scale.schedule("demo.tasks.fail", kwargs={"times": 1}, retry_backoff=0)
    doomed = cron_at_scale.schedule("demo.tasks.fail", kwargs={"times": 9}, max_retries=1, retry_backoff=0)
    plain_error = cron_at_scale.schedule("demo.tasks.fail", args=["not-a-number"], max_retries=5)

    def settled():
        return (Job.objects.filter(id__in=[autoretry.id, self_retry.id, per_job.id], status="completed").count() == 3
                and Job.objects.filter(id__in=[doomed.id, plain_error.id], status="failed").count() == 2)

    wait_until(settled, timeout=60, what="retried jobs to settle")
    assert outcomes(autoretry) == ["retried", "retried", "succeeded"]
    assert outcomes(self_retry) == ["retried", "succeeded"]
    assert outcomes(per_job) == ["retried", "succeeded"]
    assert outcomes(doomed) == ["retried", "failed"]  # max_retries=1: two attempts, then the DLQ
    assert outcomes(plain_error) == ["failed"]  # not a retryable error: fails at once
    # Backoff is a database state: the retried attempt's job waited its delay on the database clock.
    first, second = JobAttempt.objects.filter(job_id=autoretry.id).order_by("attempt")[:2]
    assert (second.scheduled_at - first.finished_at).total_seconds() >= 0.99  # retry_backoff=1, no jitter
    assert Execution.objects.filter(job_id__in=[autoretry.id, self_retry.id, per_job.id]).count() == 3
    last = JobAttempt.objects.get(job_id=doomed.id, attempt=2)
    assert "RetryableError" in last.error and "Traceback" in last.traceback
    dead = {m["job_id"]: m for m in drain_dlq(system.app, timeout=3)}
    assert set(dead) == {str(doomed.id), str(plain_error.id)}
    assert dead[str(doomed.id)]["attempt"] == 2 and dead[str(doomed.id)]["task"] == "demo.tasks.fail"


def test_a_failed_cron_occurrence_does_not_stop_the_schedule(system):
    system.worker("w1")
    system.dispatcher("d1")
    wait_for_workers(system.app, ["w1"])
    job = cron_at_scale.schedule("demo.tasks.fail", kwargs={"times": 2}, cron="* * * * * *", max_retries=0)
    wait_until(lambda: Execution.objects.filter(job_id=job.id).exists(), timeout=30, what="a later occurrence to run")
    wait_until(lambda: "succeeded" in outcomes(job), timeout=10, what="its success to be recorded")
    cron_at_scale.cancel(job.id)
    got = outcomes(job)
    assert got[:2] == ["failed", "failed"] and "succeeded" in got


def test_cancelling_a_running_job_reaches_it_through_the_heartbeat(system):
    system.env["CRON_AT_SCALE_SETTINGS"] = json.dumps({"HEARTBEAT_INTERVAL": 0.2})
    system.worker("w1")
    system.dispatcher("d1")
    wait_for_workers(system.app, ["w1"])
    job = cron_at_scale.schedule("demo.tasks.sleep", kwargs={"seconds": 30})
    wait_until(lambda: JobAttempt.objects.filter(job_id=job.id, outcome="running").exists(), what="the job to start")
    assert cron_at_scale.cancel(job.id)
    wait_until(lambda: JobAttempt.objects.get(job_id=job.id).outcome == "cancelled", timeout=10,
               what="the running attempt to end cancelled")
    assert Job.objects.get(id=job.id).status == "cancelled"
    assert not Execution.objects.filter(job_id=job.id).exists()  # it stopped before recording
