"""``celery -A example_project beat -S cron_at_scale.beat:Scheduler`` as the dispatcher, with a real worker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from demo.models import Execution
from demo.runner import wait_for_workers
from helpers import wait_until

from cron_at_scale.beat import sync_beat_schedule
from cron_at_scale.models import Job, JobAttempt

pytestmark = pytest.mark.acceptance

ENTRY = {"record-every-second": {"task": "demo.tasks.record", "schedule": 1.0}}
# The example project has no beat_schedule: beat gets it from a settings module made for this test.
SETTINGS = f"""from example_project.settings import *  # noqa: F403
CELERY_BEAT_SCHEDULE = {ENTRY!r}
"""


def test_celery_beat_with_our_scheduler_fires_synced_entries_and_stops_cleanly(system, tmp_path):
    report = sync_beat_schedule(ENTRY)  # what beat does at start; beat must then find the job unchanged
    assert report.created == ["record-every-second"]
    job = Job.objects.get(key="beat:record-every-second")

    system.worker("w1", concurrency=2)
    wait_for_workers(system.app, ["w1"])
    (tmp_path / "beat_settings.py").write_text(SETTINGS)
    system.env = {**system.env, "DJANGO_SETTINGS_MODULE": "beat_settings", "LOG_LEVEL": "INFO",
                  "PYTHONPATH": os.pathsep.join([str(tmp_path), system.env["PYTHONPATH"]])}
    schedule_file = tmp_path / "celerybeat-schedule"
    beat = system._spawn([sys.executable, "-m", "celery", "-A", "example_project", "beat",
                          "-S", "cron_at_scale.beat:Scheduler", "-s", str(schedule_file), "-l", "info"], "beat")

    wait_until(lambda: Execution.objects.filter(job_id=job.id).count() >= 4, timeout=60, what="four runs through beat")
    assert beat.poll() is None
    assert Job.objects.filter(key="beat:record-every-second").count() == 1
    assert Job.objects.get(id=job.id).status == "pending"
    runs = sorted(JobAttempt.objects.filter(job_id=job.id, outcome="succeeded").values_list("scheduled_at", flat=True))
    gaps = [(b - a).total_seconds() for a, b in zip(runs, runs[1:], strict=False)]
    assert gaps and all(g >= 1.0 and g.is_integer() for g in gaps), gaps  # on the one-second grid, no drift

    os.killpg(beat.pid, signal.SIGTERM)
    try:
        code = beat.wait(timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("celery beat did not stop within 20 s of SIGTERM")
    log = (tmp_path / "logs" / "beat.log").read_text()
    assert code == 0, log
    assert "Traceback" not in log
    assert "1 unchanged, 0 disabled, 0 not mapped" in log  # ours; beat's default celery.backend_cleanup is created
    assert not list(tmp_path.glob("celerybeat-schedule*"))  # beat's shelve file is never opened

    # Beat was the only dispatcher: once it stopped, the job stops firing (at most one run was in flight).
    time.sleep(1.5)
    settled = Execution.objects.filter(job_id=job.id).count()
    time.sleep(2.5)
    assert Execution.objects.filter(job_id=job.id).count() == settled
