"""Installing from the repository: build the sdist and wheel (``python -m build``), install the wheel in a
clean virtualenv (no repository on its path), and run a minimal Django + Celery project on it."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

REPO = Path(__file__).resolve().parents[2]

SETTINGS = """
import os
import dj_settings_db  # noqa: F401  (the database, below, from the test's own settings)

SECRET_KEY = "install-test"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
                  "django.contrib.sessions", "django.contrib.messages", "cron_at_scale"]
MIDDLEWARE = ["django.contrib.sessions.middleware.SessionMiddleware",
              "django.contrib.auth.middleware.AuthenticationMiddleware",
              "django.contrib.messages.middleware.MessageMiddleware"]
TEMPLATES = [{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True,
              "OPTIONS": {"context_processors": ["django.template.context_processors.request",
                                                 "django.contrib.auth.context_processors.auth",
                                                 "django.contrib.messages.context_processors.messages"]}}]
ROOT_URLCONF = "proj.urls"
DATABASES = {"default": {**dj_settings_db.DATABASE, "CONN_MAX_AGE": 600}}
CELERY_DB_REUSE_MAX = 1000
CELERY_BROKER_URL = os.environ["CELERY_BROKER_URL"]
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CRON_AT_SCALE = {}
"""

CELERY = """
import os
from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")
app = Celery("proj", task_cls="cron_at_scale.worker:JobTask")   # the one line
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
"""

MANAGE = """
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")
    from django.core.management import execute_from_command_line
    execute_from_command_line(sys.argv)
"""


def run(args, **kw) -> subprocess.CompletedProcess:
    out = subprocess.run(args, capture_output=True, text=True, timeout=600, **kw)
    assert out.returncode == 0, f"{args}\n{out.stdout}\n{out.stderr}"
    return out


def test_the_wheel_installs_in_a_clean_virtualenv_and_a_minimal_project_checks_and_migrates(tmp_path):
    from django.db import connection

    dist = tmp_path / "dist"
    run([sys.executable, "-m", "build", "--outdir", str(dist), str(REPO)])  # sdist, then the wheel from it
    (wheel,) = dist.glob("cron_at_scale-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("cron_at_scale/sql/dispatcher.sql", "cron_at_scale/sql/worker.sql", "cron_at_scale/py.typed",
                   "cron_at_scale/templates/admin/cron_at_scale/dashboard.html",
                   "cron_at_scale/templates/admin/cron_at_scale/job/change_list.html",
                   "cron_at_scale/migrations/0001_initial.py", "cron_at_scale/migrations/__init__.py",
                   "cron_at_scale/management/commands/cron_dispatcher.py"):
        assert needed in names, needed
    assert not any(n.startswith(("tests/", "example_project/", "devservices/", "bench/")) for n in names)

    # A clean virtualenv with the wheel. Its dependencies are the ones this test runs with: their
    # directory is on its path as a plain entry, so the .pth files there (this repository's
    # editable install among them) are not read.
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)])

    project = tmp_path / "project"
    (project / "proj").mkdir(parents=True)
    (project / "proj" / "__init__.py").write_text("from .celery import app as celery_app  # noqa: F401\n")
    (project / "proj" / "celery.py").write_text(CELERY)
    (project / "proj" / "settings.py").write_text(SETTINGS)
    (project / "proj" / "urls.py").write_text(
        "from django.contrib import admin\nfrom django.urls import path\n\nurlpatterns = [path('admin/', admin.site.urls)]\n")
    (project / "manage.py").write_text(MANAGE)
    db = {k: connection.settings_dict[k] for k in ("NAME", "USER", "PASSWORD", "HOST", "PORT")}
    name = f"{db['NAME']}_install"
    (project / "dj_settings_db.py").write_text(
        f"DATABASE = {dict(db, NAME=name, ENGINE='django.db.backends.postgresql')!r}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE", "DATABASE_URL")}
    env["CELERY_BROKER_URL"] = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0")

    where, path = run([str(python), "-c", "import cron_at_scale, sys; print(cron_at_scale.__file__); print(sys.path)"],
                      cwd=project, env=env).stdout.splitlines()
    assert where.startswith(str(site)), where  # the installed copy
    assert not {str(REPO), str(REPO / "example_project"), str(REPO / "tests")} & set(eval(path)), path  # noqa: S307

    with connection.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}"')
        cur.execute(f'CREATE DATABASE "{name}"')
    try:
        check = run([str(python), "manage.py", "check"], cwd=project, env=env)
        assert "System check identified no issues" in check.stdout + check.stderr
        plan = run([str(python), "manage.py", "migrate", "--plan"], cwd=project, env=env).stdout
        assert "cron_at_scale.0001_initial" in plan
        run([str(python), "manage.py", "migrate", "-v", "0"], cwd=project, env=env)
        status = run([str(python), "manage.py", "cron_status", "--json"], cwd=project, env=env).stdout
        assert '"pending"' in status
    finally:
        with connection.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
