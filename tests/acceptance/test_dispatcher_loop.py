"""The whole path with real processes: schedule -> PostgreSQL -> dispatcher -> Redis -> celery worker."""

from __future__ import annotations

import json

import pytest
from demo.models import Execution
from demo.runner import wait_for_workers
from helpers import sql, wait_until

import cron_at_scale
from cron_at_scale.broker.publish import publish_batch
from cron_at_scale.dispatcher import Dispatcher
from cron_at_scale.models import Job, JobAttempt

pytestmark = pytest.mark.acceptance


def executions(job) -> int:
    return Execution.objects.filter(job_id=job.id).count()


def test_one_off_delayed_cron_cancelled_and_failing_jobs_reach_their_final_states(system):
    system.worker("w1", concurrency=2)
    system.dispatcher("d1")
    wait_for_workers(system.app, ["w1"])

    now = cron_at_scale.schedule("demo.tasks.record")
    delayed = cron_at_scale.schedule("demo.tasks.record", countdown=2)
    cron = cron_at_scale.schedule("demo.tasks.record", cron="* * * * * *")
    doomed = cron_at_scale.schedule("demo.tasks.record", countdown=3)
    assert cron_at_scale.cancel(doomed.id)
    failing = cron_at_scale.schedule("demo.tasks.fail", kwargs={"times": 5}, max_retries=0)
    flaky = cron_at_scale.schedule("demo.tasks.fail", kwargs={"times": 1}, max_retries=2)

    def settled():
        statuses = dict(Job.objects.filter(schedule_type="once").values_list("id", "status"))
        return (statuses[now.id] == statuses[delayed.id] == statuses[flaky.id] == "completed"
                and statuses[failing.id] == "failed")

    wait_until(settled, timeout=60, what="one-off jobs to finish")
    wait_until(lambda: executions(cron) >= 3, timeout=30, what="three cron runs")
    # A run's completion is written by its worker's background thread, a few ms after the run.
    wait_until(lambda: JobAttempt.objects.filter(job_id=cron.id, outcome="succeeded").count() >= 3, timeout=10,
               what="three cron runs recorded")
    assert cron_at_scale.cancel(cron.id)

    assert executions(now) == executions(delayed) == 1
    delayed_run = Execution.objects.get(job_id=delayed.id)
    assert delayed_run.executed_at >= Job.objects.get(id=delayed.id).fire_at  # never early
    assert executions(doomed) == 0 and Job.objects.get(id=doomed.id).status == "cancelled"

    failed = JobAttempt.objects.get(job_id=failing.id)
    assert failed.outcome == "failed" and "failing attempt 1 of 5" in failed.error and "RetryableError" in failed.traceback
    outcomes = list(JobAttempt.objects.filter(job_id=flaky.id).order_by("attempt").values_list("outcome", flat=True))
    assert outcomes == ["retried", "succeeded"]
    assert Job.objects.get(id=flaky.id).retries == 1

    # Cron runs: one attempt per occurrence, a second apart on the schedule (no drift).
    runs = sorted(JobAttempt.objects.filter(job_id=cron.id, outcome="succeeded").values_list("scheduled_at", flat=True))
    assert len(runs) >= 3
    assert all((b - a).total_seconds() == 1.0 for a, b in zip(runs, runs[1:]))
    assert all(r.microsecond == 0 for r in runs)
    # The task knows which occurrence it runs (current_job().occurrence, from the message header).
    seen = set(Execution.objects.filter(job_id=cron.id).values_list("occurrence", flat=True))
    assert seen and seen <= set(runs)
    # No attempt ran twice.
    assert not sql("SELECT job_id, attempt FROM demo_execution GROUP BY 1, 2 HAVING count(*) > 1")


def test_a_message_delivered_twice_is_executed_once(system):
    jobs = [cron_at_scale.schedule("demo.tasks.record") for _ in range(20)]
    batch = Dispatcher(name="test").claim()
    assert len(batch) == 20
    publish_batch(system.app, batch)
    publish_batch(system.app, batch)  # every message twice: a broker redelivery
    system.worker("w1", concurrency=2)
    wait_for_workers(system.app, ["w1"])
    wait_until(lambda: Job.objects.filter(status="completed").count() == 20, what="20 completed jobs")
    publish_batch(system.app, batch)  # and once more after they finished
    wait_until(lambda: sql("SELECT count(*) FROM cron_at_scale_jobattempt WHERE outcome = 'succeeded'")[0][0] == 20)
    import time

    time.sleep(1.0)  # the late copies reach the worker and are skipped
    for job in jobs:
        assert executions(job) == 1


def test_a_job_cancelled_after_its_claim_is_skipped_and_recorded(system):
    job = cron_at_scale.schedule("demo.tasks.record")
    batch = Dispatcher(name="test").claim()
    assert cron_at_scale.cancel(job.id)
    publish_batch(system.app, batch)
    system.worker("w1")
    wait_for_workers(system.app, ["w1"])
    wait_until(lambda: JobAttempt.objects.get(job_id=job.id).outcome == "cancelled", what="the skip to be recorded")
    assert executions(job) == 0
    assert Job.objects.get(id=job.id).status == "cancelled"


def test_four_dispatcher_processes_claim_20000_due_jobs_exactly_once(system):
    # No worker consumes the queue: fire into it anyway (by default its jobs would wait unclaimed).
    system.env["CRON_AT_SCALE_SETTINGS"] = json.dumps({"HOLD_UNCONSUMED_QUEUES": False})
    for i in range(4):
        # A long lease: no worker runs these, and the reaper must not re-fire them.
        system.dispatcher(f"d{i}", extra=["--lease", "600"])
    # The jobs go in once all four hold shards: one dispatcher alone claims 20,000 in about a second.
    wait_until(lambda: sql("SELECT count(DISTINCT owner) FROM cron_at_scale_shardlease "
                           "WHERE owner <> '' AND expires_at > statement_timestamp()")[0][0] == 4,
               timeout=60, what="four dispatchers holding shards")
    cron_at_scale.schedule_many([{"task": "demo.tasks.noop"} for _ in range(20_000)])
    wait_until(lambda: not Job.objects.filter(status="pending").exists(), timeout=120, what="all jobs claimed")
    system.stop()
    rows = sql("SELECT count(*), count(DISTINCT job_id), max(attempt) FROM cron_at_scale_jobattempt")
    assert rows[0] == (20_000, 20_000, 1)
    assert Job.objects.filter(status="in_progress", attempts=1).count() == 20_000
    by_dispatcher = dict(sql("SELECT locked_by, count(*) FROM cron_at_scale_job GROUP BY 1"))
    assert sum(by_dispatcher.values()) == 20_000
    assert len(by_dispatcher) >= 2, by_dispatcher  # they really ran side by side
