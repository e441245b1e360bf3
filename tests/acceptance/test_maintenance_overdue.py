"""Has it run? Real ``celery worker`` and two ``cron_dispatcher`` processes: per-second cron jobs
whose task fails or whose queue has no worker become overdue after their grace; each episode
signals once (two dispatchers watching); cron_status --json and the metrics show it; a worker for
the queue makes its job succeed, which ends the episode (``job_recovered``, once). A paused job
and a job before its first occurrence are never overdue. With ``HISTORY_PER_JOB`` small, a
per-second job keeps a bounded attempt log and its counters stay right.

What the tasks and the signals did is counted in files (the ledger), outside the jobs' database.
"""

from __future__ import annotations

import json
import time
import uuid
from io import StringIO
from pathlib import Path

import pytest
from demo.runner import wait_for_workers
from django.core.management import call_command
from helpers import sql, wait_until
from kombu import Connection

import cron_at_scale
from cron_at_scale.maintenance.overdue import CHECK_INTERVAL
from cron_at_scale.models import Job, JobAttempt
from cron_at_scale.ops import metrics

pytestmark = pytest.mark.acceptance

GRACE = 2.0  # the jobs meant to be overdue
CALM = 30.0  # the others': a loaded test machine may delay a healthy run by a few seconds
KEEP = 5
SETTINGS = {"WORKER_HEARTBEAT_INTERVAL": 1.0, "LOOKAHEAD": 0.5, "HISTORY_PER_JOB": KEEP,
            "HOLD_UNCONSUMED_QUEUES": True}


def signals(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def sent(path: Path, name: str, job) -> list[dict]:
    return [s for s in signals(path) if s["signal"] == name and s["job"] == str(job.id)]


def ledger_ends(directory: Path, job) -> set[int]:
    attempts = set()
    for f in directory.glob("ledger-*.jsonl"):
        for line in f.read_text().splitlines():
            event = json.loads(line)
            if event["ev"] == "end" and event["job"] == str(job.id):
                attempts.add(event["attempt"])
    return attempts


@pytest.mark.timeout(300)
def test_overdue_jobs_signal_once_per_episode_recover_on_success_and_history_stays_bounded(system, tmp_path):
    ledger_dir, signal_file = tmp_path / "ledger", tmp_path / "signals.jsonl"
    ledger_dir.mkdir()
    queue = f"cas_overdue_{uuid.uuid4().hex[:8]}"  # nobody consumes it until w2 starts
    system.env.update(CRON_AT_SCALE_SETTINGS=json.dumps(SETTINGS), CRON_SIGNAL_LEDGER=str(signal_file),
                      NEMESIS_LEDGER_DIR=str(ledger_dir))
    system.worker("w1", concurrency=2)
    wait_for_workers(system.app, ["w1"])
    wait_until(lambda: sql("SELECT count(*) FROM cron_at_scale_workerhealth WHERE queues ? 'celery'")[0][0],
               timeout=60, what="w1's health row")
    system.dispatcher("d1")
    system.dispatcher("d2")
    wait_until(lambda: sql("SELECT count(*) FROM cron_at_scale_dispatcherheartbeat")[0][0] >= 2, timeout=60,
               what="two dispatchers")  # up before the jobs: what makes them overdue is not a slow start

    every_second = {"cron": "* * * * * *", "grace": GRACE}
    broken = cron_at_scale.schedule("demo.tasks.fail", kwargs={"times": 10**6}, key="e2e-broken", **every_second)
    unconsumed = cron_at_scale.schedule("demo.ledger.record", queue=queue, key="e2e-no-worker", **every_second)
    healthy = cron_at_scale.schedule("demo.ledger.record", key="e2e-healthy", cron="* * * * * *", grace=CALM)
    paused = cron_at_scale.schedule("demo.tasks.fail", kwargs={"times": 10**6}, key="e2e-paused", **every_second)
    assert cron_at_scale.pause(paused.id)
    later = cron_at_scale.schedule("demo.ledger.record", every=3600, grace=GRACE, key="e2e-later")

    wait_until(lambda: sent(signal_file, "job_overdue", broken) and sent(signal_file, "job_overdue", unconsumed),
               timeout=90, what="job_overdue for the failing job and the job without a worker")
    (first_failure,) = sent(signal_file, "job_overdue", broken)
    failed = JobAttempt.objects.filter(job_id=broken.id, outcome="failed").order_by("attempt").first()
    assert failed is not None and first_failure["expected_at"] == failed.scheduled_at.isoformat()  # its first run
    wait_until(lambda: Job.objects.get(id=healthy.id).last_success_at is not None, timeout=30,
               what="the healthy job's first success")
    out = StringIO()
    call_command("cron_status", "--json", stdout=out)
    report = json.loads(out.getvalue())
    shown = {o["key"] for o in report["overdue_jobs"]}
    assert {"e2e-broken", "e2e-no-worker"} <= shown and not shown & {"e2e-healthy", "e2e-paused", "e2e-later"}, shown
    text = metrics.render().decode()
    for key, value in (("e2e-broken", 1), ("e2e-no-worker", 1), ("e2e-healthy", 0), ("e2e-paused", 0),
                       ("e2e-later", 0)):
        assert f'cron_job_overdue{{key="{key}"}} {value}.0' in text, key
    assert 'cron_job_last_success_timestamp_seconds{key="e2e-healthy"}' in text
    assert 'cron_job_last_success_timestamp_seconds{key="e2e-broken"}' not in text

    system.worker("w2", concurrency=1, extra=["-Q", queue])  # the missing worker comes
    wait_until(lambda: sent(signal_file, "job_recovered", unconsumed), timeout=90, what="job_recovered")
    assert ledger_ends(ledger_dir, unconsumed), "recovered without a run"
    time.sleep(2 * CHECK_INTERVAL + 1)  # more passes of both dispatchers' watches: nothing sent twice

    (overdue_event,) = sent(signal_file, "job_overdue", unconsumed)
    (recovered,) = sent(signal_file, "job_recovered", unconsumed)
    assert recovered["reason"] == "succeeded" and recovered["last_success_at"]
    assert overdue_event["late_seconds"] >= GRACE
    assert len(sent(signal_file, "job_overdue", broken)) == 1 and not sent(signal_file, "job_recovered", broken)
    for job in (healthy, paused, later):
        assert not [s for s in signals(signal_file) if s["job"] == str(job.id)], job.key
    assert Job.objects.get(id=broken.id).overdue_since is not None
    assert Job.objects.get(id=unconsumed.id).overdue_since is None

    # Bounded history: the healthy per-second job kept its latest attempts only, its counters intact.
    row = Job.objects.get(id=healthy.id)
    numbers = sorted(JobAttempt.objects.filter(job_id=healthy.id).values_list("attempt", flat=True))
    print(f"healthy job: {row.attempts} attempts, {len(numbers)} rows kept ({numbers[0]}..{numbers[-1]})")
    assert row.attempts > 3 * KEEP and numbers[0] > 1, "nothing was trimmed"
    assert len(numbers) <= KEEP + 15, numbers  # + what a per-second job fires between two trims (10 s)
    assert numbers == list(range(numbers[0], numbers[-1] + 1)) and numbers[-1] == row.attempts  # latest kept
    ran = ledger_ends(ledger_dir, healthy)
    assert row.lost_attempts == 0 and len(ran) >= row.attempts - row.skipped_occurrences - 2  # 2: in flight
    with Connection(system.app.conf.broker_url) as conn:
        conn.channel().queue_purge(queue)
