"""Test settings: the example project's, with embedded services (when no
DATABASE_URL / CELERY_BROKER_URL is set) kept under .test-data/."""

import os
from pathlib import Path

os.environ.setdefault("CRON_AT_SCALE_DATA_DIR", str(Path(__file__).resolve().parent.parent / ".test-data"))

from example_project.settings import *  # noqa: E402,F403

LOGGING = {"version": 1, "disable_existing_loggers": False}

# cron_import_beat imports django-celery-beat's PeriodicTask rows: its tests need its tables.
INSTALLED_APPS = [*INSTALLED_APPS, "django_celery_beat"]  # noqa: F405

# The tests in this process claim and read the messages off the broker with no worker running:
# fire into unconsumed queues unless a test says otherwise (the processes they start keep the default).
# The metrics' database gauges computed on every scrape (tests change the database and scrape at
# once), and the per-key series on (the overdue tests read them); tests/integration/test_ops_metrics.py
# checks the defaults.
CRON_AT_SCALE = {"HOLD_UNCONSUMED_QUEUES": False, "METRICS_CACHE_SECONDS": 0, "METRICS_JOB_KEYS": True,
                 **CRON_AT_SCALE}  # noqa: F405
