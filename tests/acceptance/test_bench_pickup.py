"""The pickup benchmark (bench/pickup.py) at a low rate for a few seconds: every hop of every job is timed.

A smoke test, not a timed one: no figure is compared with a target, only that each job
scheduled due now ran, and that each process's probe (the dispatcher's wake-up, claim and
publish; the worker parent's receipt; the pool child's prerun, start statement and body)
recorded it, so that each hop of the table has one figure per job.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.acceptance

ROOT = Path(__file__).resolve().parents[2]
CHAIN = ("scheduled", "claim_start", "claimed", "published", "received")
# Then a job started by its pool process (prerun, started, body) or, while the pool was busy, by the
# worker's parent in a batch (started, prerun, body: BATCH_STARTS)
WORKER_CHAINS = (("received", "prerun", "started", "body"), ("received", "started", "prerun", "body"))


def test_the_pickup_benchmark_times_every_hop_of_every_job(transactional_db, broker):
    from demo.runner import child_env, database_url
    from django.conf import settings
    from django.db import connection

    env = child_env(database_url(connection.settings_dict), settings.CELERY_BROKER_URL)
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "pickup.py"), "--rates", "40", "--duration", "2",
                           "--warmup", "0.5", "--workers", "1", "--concurrency", "2"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])

    run = r["rates"]["40"]
    assert run["jobs"] == 80 and run["ran"] == 80
    hops = run["hops"]
    for a, b in zip(CHAIN, CHAIN[1:], strict=False):
        assert hops[f"{a} -> {b}"]["n"] == 80, (a, b)
        assert {"p50", "p99", "max"} <= set(hops[f"{a} -> {b}"])
    for i in range(3):  # each job took one of the two ways: every hop of it timed
        names = [f"{c[i]} -> {c[i + 1]}" for c in WORKER_CHAINS]
        assert sum(hops.get(n, {"n": 0})["n"] for n in names) == 80, names
    assert hops["total: scheduled -> body"]["n"] == 80
    assert hops["total: scheduled -> body"]["p50"] > 0
    assert run["woken_by_notify"] > 0  # the dispatcher's LISTEN probe saw the wake-ups
    assert "scheduled -> woke (woken jobs)" in hops
    assert isinstance(run["dispatcher_loop"], dict)  # the loop's other work, by kind (maybe none this short)
    assert "p99" in proc.stderr  # the table


def test_the_plain_celery_baseline_times_the_same_hops_without_the_database(transactional_db, broker):
    """``--plain``: plain ``send_task`` to the same workers, no dispatcher; each task's hops timed."""
    from demo.runner import child_env, database_url
    from django.conf import settings
    from django.db import connection

    env = child_env(database_url(connection.settings_dict), settings.CELERY_BROKER_URL)
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "pickup.py"), "--plain", "--rates", "40",
                           "--duration", "2", "--warmup", "0.5", "--workers", "1", "--concurrency", "2"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["path"] == "plain Celery send_task"
    run = r["rates"]["40"]
    assert run["jobs"] == 80 and run["ran"] == 80
    assert run["woken_by_notify"] == 0  # no dispatcher on this path
    for hop in ("scheduled -> received", "received -> prerun", "prerun -> body", "total: scheduled -> body"):
        assert run["hops"][hop]["n"] == 80, hop
    assert "claim_start -> claimed" not in run["hops"]
