"""The 64 shards on two databases (``CRON_AT_SCALE["SHARD_DATABASES"]``), in the main run: the cases
of ``sharded_cases.py`` need other settings (two aliases, the router, the shard map), and
pytest-django configures Django once per run, so they run in a pytest of their own, on the same
PostgreSQL server and broker as this run (their test databases are ``test_<name>_sharded`` and
``test_<name>_sharded_second``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.acceptance

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@pytest.fixture
def second_cluster():
    """A private PostgreSQL cluster for the ``second`` alias (None where none can start here)."""
    from faults import faultkit

    try:
        pg = faultkit.PrivatePostgres().start()
    except faultkit.Unavailable as e:
        print(f"[sharded] no private cluster ({e}); both databases on DATABASE_URL's server")
        yield None
        return
    try:
        yield pg
    finally:
        pg.stop()


def test_the_shards_spread_over_two_clusters_pass_their_cases(second_cluster):
    from django.conf import settings

    env = {**os.environ, "DATABASE_URL": settings.DATABASE_URL, "CELERY_BROKER_URL": settings.CELERY_BROKER_URL}
    env.pop("DJANGO_SETTINGS_MODULE", None)  # --ds says which
    if second_cluster is not None:  # shards 32-63 on a cluster of their own, which a case stops
        env.update(SECOND_DATABASE_URL=second_cluster.url("postgres"), SECOND_PG_DIR=str(second_cluster.dir),
                   SECOND_PG_PORT=str(second_cluster.port))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(HERE / "sharded_cases.py"), "--ds", "tests.settings_sharded",
         "-q", "-s", "-p", "no:cacheprovider", "--timeout=300"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=720)
    print("\n".join(line[line.index("[sharded]"):] for line in done.stdout.splitlines() if "[sharded]" in line))
    assert done.returncode == 0, f"sharded_cases.py failed:\n{done.stdout[-6000:]}\n{done.stderr[-2000:]}"
    assert " passed" in done.stdout
    if second_cluster is not None:
        assert "skipped" not in done.stdout
