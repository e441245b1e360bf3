"""The benchmark (bench/run.py) at its smallest size: it runs every workload and prints its JSON line.

A smoke test, not a timed one: no figure is compared with a target here, only
that each workload ran to the end (every job fired and executed) and reported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.acceptance

ROOT = Path(__file__).resolve().parents[2]


def test_the_benchmark_runs_at_a_small_size_and_prints_a_json_line(transactional_db, broker, tmp_path):
    from demo.runner import child_env, database_url
    from django.conf import settings
    from django.db import connection

    env = child_env(database_url(connection.settings_dict), settings.CELERY_BROKER_URL)
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), "--size", "small",
                           "--png-dir", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])

    c = r["ceiling"]
    for part in ("ceiling", "firing", "burst", "general_path"):
        assert c[part]["jobs"] > 0 and c[part]["jobs_per_s"] > 0, part
    assert c["firing"]["on_broker"] == c["firing"]["jobs"]
    assert c["burst"]["on_broker"] == c["burst"]["jobs"]
    assert c["firing"]["ratio_to_ceiling"] > 0
    if os.environ.get("CELERY_RABBITMQ_URL"):  # the RabbitMQ firing rate, beside Redis's (.ci/run sets it)
        for part in ("firing", "general_path"):
            rabbit = c["rabbitmq"][part]
            assert rabbit["jobs_per_s"] > 0 and rabbit["on_broker"] == rabbit["jobs"], part
            assert len(rabbit["rounds_jobs_per_s"]) == 3
        assert c["rabbitmq"]["firing"]["confirm_wait_seconds"] >= 0

    w3 = r["w3"]
    assert w3["schedule_many"]["jobs_per_s"] > 0 and w3["empty_jobs_per_s"] > 0 and w3["full_jobs_per_s"] > 0
    assert w3["rows"] >= w3["future"]
    assert w3["claim_plan"] and isinstance(w3["index_scan"], bool)

    o = r["overhead"]
    assert o["plain_jobs_per_s"] > 0 and o["scheduled_jobs_per_s"] > 0 and o["scheduled_completed"] == o["jobs"]

    w1 = r["w1"]
    assert w1["completed"] == w1["jobs"] and w1["firing_jobs_per_s"] > 0 and w1["completion_jobs_per_s"] > 0
    assert {"p50", "p95", "p99", "max"} <= set(w1["start_lag_ms"])

    for w2 in r["w2"]:
        assert w2["started"] == w2["jobs"]
        assert w2["start_lag_ms"]["n"] == w2["jobs"] and w2["series"]
        assert {"p50", "p95", "p99", "max"} <= set(w2["dispatch_lag_ms"])

    eta = r["eta"]
    assert eta["burst"]["executed"] == eta["burst"]["jobs"] and eta["burst"]["start_lag_ms"]["p99"] is not None
    assert eta["spread"]["executed"] == eta["spread"]["jobs"]

    lag = r["lag"]
    for turn in lag["turns"]:  # ours with each ETA lead (0 and the setting's) and Celery's ETA stream
        assert set(turn) >= {"ours_lead_0", "celery_eta"} and len(turn) == 3
        assert all(side["n"] == lag["jobs"] for side in turn.values()), turn
    assert set(lag["median"]) == set(lag["turns"][0])

    names = {t["target"] for t in r["targets"]}
    assert any("firing" in n for n in names) and any("schedule_many" in n for n in names)
    assert all(isinstance(t["met"], bool) for t in r["targets"])
    assert r["machine"]["cpus"] and r["machine"]["load_start"]
    assert "target" in proc.stderr  # the table


def test_the_cpu_count_keeps_processes_that_exited_during_the_window():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_run", ROOT / "bench" / "run.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    groups = ("pool", "postgres", "pg_aux")
    # pool process 5 exits (2.0 s before the window, 2.5 at its end: its parent, 1, reaps it), 6 starts;
    # backend 20 exits (3.0 → 4.0), an autovacuum worker (pg_aux, 0.5 → 0.7) too: the postmaster 9 reaps both
    before = {"pool": {-1: 0.0, 5: 2.0}, "postgres": {-9: 10.0, 20: 3.0, 21: 1.0}, "pg_aux": {30: 0.5}}
    after = {"pool": {-1: 2.5, 6: 0.2}, "postgres": {-9: 14.7, 21: 1.5}, "pg_aux": {}}
    used = bench.cpu_ms_per(before, after, 1000, groups)
    assert used["pool"] == 0.7  # ms per item: (0.5 + 0.2) s over 1,000
    assert used["postgres"] == 1.7  # 1.0 + 0.5 + the autovacuum worker's 0.2
