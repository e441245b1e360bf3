"""The start benchmark (bench/start_batch.py) on a few jobs: it runs every way and reports what each writes.

A smoke test, not a timed one: no CPU figure is compared with a target. What it does check is
what every way of starting writes per task, which a schema or statement change would move: the
one-off job's row once (its completion) and the attempt's row twice (its start and its end).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.acceptance

ROOT = Path(__file__).resolve().parents[2]


def test_the_start_benchmark_reports_cpu_and_writes_for_every_way(transactional_db, broker):
    from demo.runner import child_env, database_url
    from django.conf import settings
    from django.db import connection

    env = child_env(database_url(connection.settings_dict), settings.CELERY_BROKER_URL)
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "start_batch.py"), "--jobs", "60", "--turns", "1",
                           "--batches", "1,4"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = proc.stdout
    assert re.search(r"start_attempt, one per task +\d+\.\d{3}", out), out
    for k in (1, 4):
        assert re.search(rf"start_attempts, batches of {k} +\d+\.\d{{3}} +\d+\.\d{{3}} +\d+\.\d{{3}}", out), out
    written = re.findall(r"^(start_attempts?[^\n]*?) +(\d+) B  job ([\d.]+)/([\d.]+)/([\d.]+)  "
                         r"jobattempt ([\d.]+)/([\d.]+)/([\d.]+)$", out, re.M)
    assert len(written) == 3, out
    for how, wal, *rows in written:
        job_ins, job_hot, job_new, att_ins, att_hot, att_new = map(float, rows)
        assert int(wal) > 0, how
        assert (job_ins, job_hot + job_new) == (0, 1), how  # the completed one-off, once
        assert (att_ins, att_hot + att_new) == (0, 2), how  # started, then ended
