"""Retries, dead-lettering and cooperative cancellation with a real celery worker."""

from __future__ import annotations

import json
import uuid

import pytest
from celery.utils.time import get_exponential_backoff_interval
from demo.models import Execution
from demo.runner import wait_for_workers
from helpers import drain_dlq, wait_until

import cron_at_scale
from cron_at_scale.models import Job, JobAttempt

pytestmark = pytest.mark.acceptance


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

    # retry_backoff=0 turns the task's backoff off: the default schedule's first delay, 15-30 s jittered
    wait_until(settled, timeout=120, what="retried jobs to settle")
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


# task: (attempts, delays before each retry in seconds, or None where jitter draws them)
LIKE_CELERY = {
    "demo.tasks.celery_backoff": (5, [1, 2, 4, 8]),  # max_retries=4, retry_backoff=True
    "demo.tasks.celery_capped": (5, [1, 2, 2, 2]),  # retry_kwargs max_retries=4, retry_backoff=1, max 2
    "demo.tasks.celery_jitter": (5, None),  # retry_backoff=2, max 2, full jitter: 0, 1 or 2
    "demo.tasks.celery_self_retry": (4, [2, 1, 1]),  # self.retry(countdown=2), (eta=+1 s), (), (max_retries=3)
}


def ledger(tag):
    from demo.tasks import broker_redis

    with broker_redis() as r:
        return [v.decode() for v in r.lrange(f"retry-ledger:{tag}", 0, -1)]


def test_celerys_retry_options_mean_what_they_mean_in_a_plain_celery_worker(system):
    """Each task runs once as plain Celery (ETA messages) and once scheduled (database states): same
    attempts, same delays (ours on the database clock; Celery's from the times its attempts started)."""
    system.worker("w1", concurrency=2)
    system.dispatcher("d1")
    wait_for_workers(system.app, ["w1"])
    run = uuid.uuid4().hex[:8]
    jobs = {}
    for name in LIKE_CELERY:
        system.app.send_task(name, kwargs={"tag": f"{run}-celery-{name}"})  # plain Celery: no job, ETA retries
        jobs[name] = cron_at_scale.schedule(name, kwargs={"tag": f"{run}-ours-{name}"})  # no max_retries: the task's

    def settled():
        return (Job.objects.filter(id__in=[j.id for j in jobs.values()], status="failed").count() == len(jobs)
                and all(ledger(f"{run}-celery-{name}")[-1:] == ["failed"] for name in LIKE_CELERY))

    wait_until(settled, timeout=90, what="both runs of every task to fail for good")
    for name, (attempts, delays) in LIKE_CELERY.items():
        theirs = [float(t) for t in ledger(f"{run}-celery-{name}")[:-1]]
        rows = list(JobAttempt.objects.filter(job_id=jobs[name].id).order_by("attempt"))
        assert len(theirs) == attempts, (name, theirs)
        assert [r.outcome for r in rows] == ["retried"] * (attempts - 1) + ["failed"], name
        assert len(ledger(f"{run}-ours-{name}")) == attempts + 1  # every attempt ran, then the final failure
        celery_delays = [b - a for a, b in zip(theirs, theirs[1:])]
        ours = [(b.scheduled_at - a.finished_at).total_seconds() for a, b in zip(rows, rows[1:])]
        for a, b in zip(rows, rows[1:]):  # a retry never started before its delay (database clock)
            assert (b.started_at - a.finished_at).total_seconds() >= (b.scheduled_at - a.finished_at).total_seconds() - 0.1
        print(f"{name}: attempts ours {len(rows)} celery {len(theirs)}; delays ours {[round(d, 3) for d in ours]} "
              f"celery {[round(d, 3) for d in celery_delays]}")
        if delays is None:  # drawn: whole seconds (ours to the millisecond the database keeps) within 0..2
            assert all(-0.01 <= d <= 2.01 and abs(d - round(d)) < 0.01 for d in ours), (name, ours)
            assert all(-0.05 <= d <= 3.0 for d in celery_delays), (name, celery_delays)
            continue
        assert [round(d) for d in ours] == delays, (name, ours)
        assert all(abs(o - c) <= 0.8 for o, c in zip(ours, celery_delays)), (name, ours, celery_delays)


def test_a_jobs_retry_backoff_is_celerys_sequence_end_to_end(system):
    """``schedule(retry_backoff=2)`` waits 2, 4, 8 s before its retries, as Celery's
    ``get_exponential_backoff_interval`` gives (once 2, 8, 32: 4**n), over the task's own
    ``retry_backoff=1``; with jitter each wait is a whole second within Celery's bound. Measured on the
    database clock: each attempt's ``scheduled_at`` (the job's ``fire_at`` after the retry) minus the
    end of the attempt before it."""
    system.worker("w1", concurrency=2)
    system.dispatcher("d1")
    wait_for_workers(system.app, ["w1"])
    exact = cron_at_scale.schedule("demo.tasks.fail", kwargs={"times": 3}, max_retries=3, retry_backoff=2,
                                   retry_jitter=False)
    drawn = cron_at_scale.schedule("demo.tasks.fail", kwargs={"times": 3}, max_retries=3, retry_backoff=True,
                                   retry_jitter=True)
    wait_until(lambda: Job.objects.filter(id__in=[exact.id, drawn.id], status="completed").count() == 2, timeout=60,
               what="both jobs to succeed after three retries")
    for job, jitter in ((exact, False), (drawn, True)):
        rows = list(JobAttempt.objects.filter(job_id=job.id).order_by("attempt"))
        assert [r.outcome for r in rows] == ["retried"] * 3 + ["succeeded"]
        waits = [(b.scheduled_at - a.finished_at).total_seconds() for a, b in zip(rows, rows[1:])]
        celerys = [get_exponential_backoff_interval(int(max(1.0, float(job.options["retry_backoff"]))), n, 600)
                   for n in range(3)]
        print(f"retry_backoff={job.options['retry_backoff']!r} jitter={jitter}: waits {[round(w, 3) for w in waits]}, "
              f"Celery's {'bounds' if jitter else 'delays'} {celerys}")
        for a, b in zip(rows, rows[1:]):  # no attempt started before its fire time
            assert b.started_at >= b.scheduled_at >= a.finished_at
        if jitter:
            assert all(abs(w - round(w)) < 0.01 and 0 <= round(w) <= top for w, top in zip(waits, celerys)), waits
        else:
            assert celerys == [2, 4, 8]
            assert all(abs(w - c) < 0.01 for w, c in zip(waits, celerys)), waits


def test_a_jobs_own_autoretry_for_dont_autoretry_for_and_retry_kwargs_in_a_real_worker(system):
    """Celery's autoretry options set on the job replace the task's (``demo.tasks.flaky``: autoretry_for
    ValueError, retry_backoff=1): its exclusion stops the retry, its retry_kwargs' max_retries bounds it."""
    system.worker("w1", concurrency=2)
    system.dispatcher("d1")
    wait_for_workers(system.app, ["w1"])
    as_task = cron_at_scale.schedule("demo.tasks.flaky", kwargs={"times": 1})
    excluded = cron_at_scale.schedule("demo.tasks.flaky", kwargs={"times": 1}, dont_autoretry_for=[ValueError])
    other_list = cron_at_scale.schedule("demo.tasks.flaky", kwargs={"times": 1}, autoretry_for=["builtins.KeyError"])
    bounded = cron_at_scale.schedule("demo.tasks.flaky", kwargs={"times": 5}, retry_kwargs={"max_retries": 1})
    jobs = [as_task, excluded, other_list, bounded]
    wait_until(lambda: Job.objects.filter(id__in=[j.id for j in jobs], status__in=["completed", "failed"]).count() == 4,
               timeout=60, what="the four jobs to end")
    assert outcomes(as_task) == ["retried", "succeeded"]
    assert outcomes(excluded) == ["failed"]
    assert outcomes(other_list) == ["failed"]
    assert outcomes(bounded) == ["retried", "failed"]
