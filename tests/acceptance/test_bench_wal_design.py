"""The WAL design benchmark (bench/wal_design.py) on a few jobs: every variant runs and reports its WAL.

A smoke test, not a measurement: what it checks is the order the designs must come in and the
index entries each writes per job, which follow from their indexes and updates: a statement of the
benchmark that stopped being HOT, or a variant that lost its reason to exist, fails it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.acceptance

ROOT = Path(__file__).resolve().parents[2]


def test_the_wal_design_benchmark_reports_every_variant_in_the_order_of_its_writes(transactional_db):
    from demo.runner import child_env, database_url
    from django.conf import settings
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_walinspect'")
        if cur.fetchone() is None:
            pytest.skip("this PostgreSQL has no pg_walinspect (contrib)")
    env = child_env(database_url(connection.settings_dict), settings.CELERY_BROKER_URL)
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "wal_design.py"), "--jobs", "400", "--warm", "100",
                           "--turns", "1"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = {v: (float(b), float(e)) for v, b, e in re.findall(
        r"^turn 1 (\w+) +(\d+) B/job without full-page images, +\d+ with; index entries/job ([\d.]+)$",
        proc.stdout, re.M)}
    assert set(found) == {"today", "v0020", "pending", "hot", "ordered", "merged", "batchlog"}, proc.stdout
    wal = {v: b for v, (b, _) in found.items()}
    entries = {v: e for v, (_, e) in found.items()}
    # today: the job row in 4 indexes at its insert, 3 at its claim, 3 at its completion; the attempt
    # row in 3 at its insert, 2 at its finish (its start is HOT)
    assert entries["today"] == pytest.approx(15, abs=0.3), proc.stdout
    # v0020: the status index over every row again, pending ones too: an entry at the insert as well
    # (the job row's updates are never HOT there, so its entries do not vary with the box's load)
    status_entries = dict(re.findall(r"^ +wal_(today|v0020)\.job_status_fire_at_id_idx +\d+ B +([\d.]+) entries$",
                                     proc.stdout, re.M))
    assert status_entries == {"today": "2.0", "v0020": "3.0"}, proc.stdout
    # pending: job 2 + pending 1 (no job index at the claim or completion: both HOT) + attempt 5
    assert entries["pending"] == pytest.approx(8, abs=0.3), proc.stdout
    # merged: job 2, pending 1, the attempt's log row 1
    assert entries["merged"] == pytest.approx(4, abs=0.3), proc.stdout
    # batchlog: the job row's two (primary key, claim order); its logs have none
    assert entries["batchlog"] == pytest.approx(2, abs=0.3), proc.stdout
    assert entries["today"] > entries["pending"] > entries["hot"] >= entries["merged"] > entries["batchlog"], proc.stdout
    assert wal["today"] > wal["pending"] > wal["hot"] > wal["merged"] > wal["batchlog"], proc.stdout
