"""Unit tests need nothing running: no PostgreSQL, no broker, no worker or dispatcher.

pytest-django already refuses database access to a test that does not ask for it; this refuses the
asking, so a unit test that wants the database fails here instead of passing only where one runs.
Tests that need a service belong in tests/integration.
"""

from __future__ import annotations

import pytest

# Fixtures of pytest-django and of tests/conftest.py that open a database or broker connection.
SERVICE_FIXTURES = frozenset({
    "db", "transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback",
    "live_server", "django_db_setup", "celery_app", "broker", "system",
})


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    # A conftest's runtest hooks see only the items under its directory; before any fixture is set up.
    wanted = sorted(SERVICE_FIXTURES.intersection(getattr(item, "fixturenames", ())))
    if item.get_closest_marker("django_db") is not None:
        wanted.append("@pytest.mark.django_db")
    if wanted:
        pytest.fail(f"a unit test may not use {', '.join(wanted)}: move it to tests/integration", pytrace=False)
