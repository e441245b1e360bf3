"""Batched starts on a real worker: the main process starts the messages it received together,
every job runs once, a pool process that dies is recorded by its cause, and a warm shutdown
hands back what no pool process began.

Real ``celery worker`` (prefork, threads and solo pools) and dispatcher processes, ``BATCH_STARTS`` on in the worker's
settings (``CRON_AT_SCALE_SETTINGS``)."""

from __future__ import annotations

import json
import signal
import socket
from collections import Counter
from datetime import timedelta

import pytest
from demo.models import Execution
from demo.runner import wait_for_workers
from django.utils import timezone
from helpers import wait_until

import cron_at_scale
from cron_at_scale.models import Job, JobAttempt

pytestmark = pytest.mark.acceptance


def batched(system, settings: dict | None = None):
    system.env["CRON_AT_SCALE_SETTINGS"] = json.dumps({"BATCH_STARTS": True, **(settings or {})})


@pytest.mark.parametrize("pool", ["prefork", "threads", "solo"])
def test_a_worker_with_batched_starts_runs_every_job_once_started_by_its_main_process(system, pool):
    # One attempt per job is counted below: on a slow box the solo pool takes longer than the
    # default dispatch lease (30 s) to reach the last of 300 messages, which would be fired again.
    batched(system, {"DISPATCH_LEASE": 300.0})
    main = system.worker("w1", concurrency=2, pool=pool)
    system.dispatcher("d1")
    wait_for_workers(system.app, ["w1"])
    jobs = cron_at_scale.schedule_many([{"task": "demo.tasks.record", "args": [i]} for i in range(300)])
    ids = {str(j.id) for j in jobs}
    wait_until(lambda: Job.objects.filter(status="completed").count() == len(ids), timeout=180,
               what="300 jobs to complete")
    runs = Counter(str(e.job_id) for e in Execution.objects.all())
    assert set(runs) == ids and set(runs.values()) == {1}  # each ran, once
    rows = list(JobAttempt.objects.all())
    assert len(rows) == len(ids) and {a.outcome for a in rows} == {"succeeded"}
    by_main = sum(a.worker == f"{socket.gethostname()}:{main.pid}" for a in rows)
    if pool == "prefork":
        # Started by the main process (its name on the attempt) while the pool is busy; by a pool process
        # when a message came with a slot free and nothing held (the first ones, the last ones), or when
        # it began its message more than FRESH after its batch (a busy box) and confirmed it.
        assert by_main >= 0.5 * len(rows), Counter(a.worker for a in rows)
    else:  # one process: the worker's
        assert by_main == len(rows), Counter(a.worker for a in rows)
    batches = Counter(a.started_at for a in rows)  # one statement per batch: its rows share started_at
    assert len(batches) < len(rows), f"{pool}: every start was its own statement"


def test_runs_published_ahead_with_an_eta_are_started_in_batches_by_the_main_process(system):
    """A run claimed ahead of its fire_at goes out ``ETA_LEAD`` early with Celery's eta; Celery's
    timer hands it over at the eta, and that hand-over goes through the batch starter too."""
    batched(system, {"DISPATCH_LEASE": 300.0, "ETA_LEAD": 1.0, "LOOKAHEAD": 1.0})
    main = system.worker("w1", concurrency=2)
    system.dispatcher("d1")
    wait_for_workers(system.app, ["w1"])
    at = timezone.now() + timedelta(seconds=4)
    jobs = cron_at_scale.schedule_many([{"task": "demo.tasks.record", "args": [i], "at": at} for i in range(200)])
    wait_until(lambda: Job.objects.filter(status="completed").count() == len(jobs), timeout=120,
               what="200 jobs to complete")
    rows = list(JobAttempt.objects.all())
    assert len(rows) == len(jobs) and {a.outcome for a in rows} == {"succeeded"}
    early = sum(a.dispatched_at < at - timedelta(seconds=0.5) for a in rows)
    assert early == len(rows), f"only {early} of {len(rows)} were claimed ahead: the eta path was not taken"
    by_main = Counter(a.worker == f"{socket.gethostname()}:{main.pid}" for a in rows)
    assert by_main[True] >= 0.5 * len(rows), by_main  # not each started by its pool process
    assert len(Counter(a.started_at for a in rows)) < len(rows), "every start was its own statement"


def test_a_pool_process_killed_in_a_batched_run_is_recorded_with_its_cause(system):
    batched(system)
    system.worker("w1", concurrency=2)
    system.dispatcher("d1")
    wait_for_workers(system.app, ["w1"])
    job = cron_at_scale.schedule("demo.tasks.kill_self", kwargs={"times": 1}, max_retries=1)
    wait_until(lambda: Job.objects.get(id=job.id).status == "completed", timeout=40,
               what="the job whose first run kills its process to complete (long before RUN_LEASE)")
    first, second = JobAttempt.objects.filter(job_id=job.id).order_by("attempt")
    assert first.outcome == "retried" and "signal 9" in first.error  # found by its token, not left to the lease
    assert second.outcome == "succeeded"
    assert Job.objects.get(id=job.id).lost_attempts == 0


def test_a_warm_shutdown_hands_back_the_started_messages_no_pool_process_began(system):
    batched(system, {"RUN_LEASE": 120.0, "HEARTBEAT_INTERVAL": 40.0})
    w1 = system.worker("w1", concurrency=1)  # one pool process, busy: the rest wait in the worker
    system.dispatcher("d1")
    wait_for_workers(system.app, ["w1"])
    jobs = cron_at_scale.schedule_many([{"task": "demo.tasks.sleep", "kwargs": {"seconds": 2.0}} for _ in range(4)])
    wait_until(lambda: JobAttempt.objects.filter(outcome="running").count() >= 2, timeout=30,
               what="a batch started: one running in the pool, others waiting")
    w1.send_signal(signal.SIGTERM)  # warm shutdown: the running task ends, the waiting ones go back
    w1.wait(60)
    waiting = JobAttempt.objects.filter(outcome="running")
    assert not waiting.exists(), [(a.job_id, a.started_at) for a in waiting]  # none left to a lease
    system.worker("w2", concurrency=2)
    wait_until(lambda: Job.objects.filter(id__in=[j.id for j in jobs], status="completed").count() == 4,
               timeout=60, what="the handed-back jobs to run on the next worker, long before RUN_LEASE (120 s)")
    runs = Counter(str(e.job_id) for e in Execution.objects.all())
    assert set(runs.values()) == {1} and len(runs) == 4  # each ran once
    assert not JobAttempt.objects.filter(outcome="lost").exists()
    assert {j.lost_attempts for j in Job.objects.filter(id__in=[j.id for j in jobs])} == {0}
