"""Fixtures shared by the integration and acceptance tests.

They run against real PostgreSQL and Redis: the ones named by DATABASE_URL /
CELERY_BROKER_URL, or embedded ones started by the settings. Acceptance
tests start real ``celery worker`` and ``cron_dispatcher`` processes.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def celery_app():
    from cron_at_scale.celery_app import get_app

    return get_app()


@pytest.fixture
def broker(celery_app):
    """The broker, emptied before and after the test."""
    celery_app.control.purge()
    yield celery_app
    celery_app.control.purge()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """Mark a test whose call failed (``item.rep_failed``): its fixtures then show what its processes logged."""
    rep = yield
    if rep.when == "call" and rep.failed:
        item.rep_failed = True
    return rep


@pytest.fixture
def system(request, transactional_db, broker, tmp_path):
    """Start real worker / dispatcher processes against the test database; stop them at the end.
    If the test failed, the last lines of each process's log are printed (the report's teardown output)."""
    from demo.runner import Processes, child_env, database_url
    from django.conf import settings
    from django.db import connection

    env = child_env(database_url(connection.settings_dict), settings.CELERY_BROKER_URL)
    procs = Processes(env, log_dir=tmp_path / "logs")
    procs.app = broker
    yield procs
    procs.stop()
    if getattr(request.node, "rep_failed", False):
        for log in sorted((tmp_path / "logs").glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()
            print(f"--- the last {min(40, len(lines))} of {len(lines)} lines of {log.name}")
            print("\n".join(lines[-40:]))
