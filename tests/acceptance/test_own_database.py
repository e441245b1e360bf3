"""The app on a database of its own (``CRON_AT_SCALE["DATABASE"]``), in the main run: the cases of
``own_database_cases.py`` need other settings (two aliases and the router), and pytest-django
configures Django once per run, so they run in a pytest of their own, on the same PostgreSQL server
and broker as this run (their test databases are ``test_<name>_owndb`` and ``test_<name>_owndb_jobs``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.acceptance

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def test_the_app_on_its_own_database_passes_its_cases():
    from django.conf import settings

    env = {**os.environ, "DATABASE_URL": settings.DATABASE_URL, "CELERY_BROKER_URL": settings.CELERY_BROKER_URL}
    env.pop("DJANGO_SETTINGS_MODULE", None)  # --ds says which
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(HERE / "own_database_cases.py"), "--ds", "tests.settings_own_database",
         "-q", "-p", "no:cacheprovider", "--timeout=300"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, f"own_database_cases.py failed:\n{done.stdout[-6000:]}\n{done.stderr[-2000:]}"
    assert " passed" in done.stdout and "skipped" not in done.stdout
