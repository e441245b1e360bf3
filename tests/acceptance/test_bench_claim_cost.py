"""The small-claim benchmark (bench/claim_cost.py) on a few claims: it claims every job it schedules
and reports how the claim was planned. A smoke test, not a timed one: no CPU figure is compared with
a target; what it checks is that the claim ran on its generic plan, never planned per claim."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.acceptance

ROOT = Path(__file__).resolve().parents[2]


def test_the_claim_benchmark_claims_everything_on_one_generic_plan(transactional_db):
    from demo.runner import child_env, database_url
    from django.conf import settings
    from django.db import connection

    env = child_env(database_url(connection.settings_dict), settings.CELERY_BROKER_URL)
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "claim_cost.py"), "--claims", "20", "--jobs", "3",
                           "--pending", "1000"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = proc.stdout
    assert "20 claims of 3 due jobs beside 1,000 pending: 60 claimed" in out, out
    assert re.search(r"PostgreSQL CPU per claim \d+\.\d{3} ms; wall p50 \d+\.\d\d ms", out), out
    generic, custom = map(int, re.search(r"claim plans on this connection: (\d+) generic, (\d+) custom", out).groups())
    assert generic >= 20 and custom == 0, out
