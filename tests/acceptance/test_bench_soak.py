"""The soak (bench/soak.py) for ~20 s at a low rate beside a few pending jobs: it prints its figures.

A smoke test, not a timed one: no lateness is compared with a target here, only that
every streamed job reached the broker once and each figure was reported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.acceptance

ROOT = Path(__file__).resolve().parents[2]


def test_the_soak_runs_briefly_and_prints_its_figures(transactional_db, broker, tmp_path):
    from demo.runner import child_env, database_url
    from django.conf import settings
    from django.db import connection

    env = child_env(database_url(connection.settings_dict), settings.CELERY_BROKER_URL)
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "soak.py"), "--pending", "2000", "--rate", "200",
                           "--minutes", "0.25", "--every", "5", "--after", "5", "--png-dir", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])

    assert r["feeder"]["inserted"] == 200 * 15
    assert r["fired"] == 200 * 15  # every streamed job on the broker, taken once by the consumer
    lateness = r["lateness"]
    assert lateness["overall"]["n"] == 200 * 15
    assert {"p50", "p95", "p99", "max"} <= set(lateness["overall"])
    assert lateness["overall"]["p50"] >= 0  # never published before its fire_at (the look-ahead holds it)
    assert [row["s"] for row in lateness["series"]] == [0.0, 5.0, 10.0]
    assert r["wal_bytes_per_job"] > 0
    for name in ("job", "attempt"):
        assert r["tables_after"][name]["heap_bytes"] > 0 and "dead" in r["tables_after"][name]
        assert name in r["autovacuum_runs"] and name in r["hot_share"]
    assert r["cpu_ms_per_job"]["dispatcher"] > 0 and r["cpu_ms_per_job"]["pg_backends"] > 0
    assert r["samples"] and all("cpu" in s and "due_unclaimed" in s for s in r["samples"])
    assert {t["target"] for t in r["targets"]} >= {"WAL bytes per fired job"}
    assert r["png"] and Path(r["png"][0]).exists()
    assert "p99" in proc.stderr and "target" in proc.stderr  # the table
