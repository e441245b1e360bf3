"""A supervisor that sends SIGTERM to a worker's whole process group (systemd's default
``KillMode=control-group``) loses no success: each pool process writes its queued completions
before it ends. Executions are counted in a ledger file, outside the jobs' database."""

from __future__ import annotations

import os
import signal
import time

import pytest
from demo.runner import wait_for_workers
from helpers import wait_until

import cron_at_scale
from cron_at_scale.models import JobAttempt

pytestmark = pytest.mark.acceptance


def test_sigterm_to_the_process_group_right_after_the_last_task_loses_no_success(system, tmp_path):
    path = tmp_path / "ledger.txt"
    jobs = 20
    worker = system.worker("w1", concurrency=2)
    wait_for_workers(system.app, ["w1"])
    for _ in range(jobs):
        cron_at_scale.schedule("demo.tasks.ledger", args=[str(path)])
    system.dispatcher("d1")

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # poll tightly: the signal must land while completions are queued
        if path.exists() and len(path.read_text().splitlines()) >= jobs:
            break
        time.sleep(0.002)
    time.sleep(0.01)  # the last task returns (its line is written first); its completion waits 0.05 s
    os.killpg(worker.pid, signal.SIGTERM)
    worker.wait(timeout=30)

    ran = [tuple(line.split()[:2]) for line in path.read_text().splitlines()]
    assert len(ran) == jobs == len(set(ran))
    try:
        wait_until(lambda: JobAttempt.objects.filter(outcome="succeeded").count() == jobs, timeout=5,
                   what="every run that executed recorded succeeded")
    except Exception:
        raise AssertionError(sorted(JobAttempt.objects.values_list("outcome", flat=True))) from None
    assert not JobAttempt.objects.exclude(outcome="succeeded").exists()
