"""Test settings with the app on a database of its own: ``CRON_AT_SCALE["DATABASE"] = "jobs"``.

The suite's settings (tests/settings.py) with two aliases on the same PostgreSQL server:
``default``, the application's (auth, sessions, the admin's users, the demo app's
``demo_execution``), and ``jobs``, every table of cron_at_scale (routed there by
``cron_at_scale.routers.CronAtScaleRouter``). A test run creates ``test_<name>_owndb`` and
``test_<name>_owndb_jobs``, not the main suite's ``test_<name>``: this run can go while that one
holds its database (tests/acceptance/test_own_database.py starts it from the main suite).

The processes a test starts (a dispatcher, a celery worker) use these settings too, with the
test databases' URLs: ``DATABASE_URL`` for ``default``, ``JOBS_DATABASE_URL`` for ``jobs``.
"""

import os

import devservices
from tests.settings import *  # noqa: F403

_default = DATABASES["default"]  # noqa: F405
_jobs_url = os.environ.get("JOBS_DATABASE_URL")
DATABASES = {
    "default": {**_default, "TEST": {"NAME": f"test_{_default['NAME']}_owndb"}},
    "jobs": {**(devservices.django_database(_jobs_url, conn_max_age=600) if _jobs_url else _default),
             "TEST": {"NAME": f"test_{_default['NAME']}_owndb_jobs"}},
}
DATABASE_ROUTERS = ["cron_at_scale.routers.CronAtScaleRouter"]

# The defaults the processes would run with, not the main suite's (which reads messages off the
# broker with no worker): a queue is held until a live worker's health row, on "jobs", lists it.
CRON_AT_SCALE = {**CRON_AT_SCALE, "HOLD_UNCONSUMED_QUEUES": True, "DATABASE": "jobs"}  # noqa: F405
