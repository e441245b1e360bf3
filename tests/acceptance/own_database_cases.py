"""The app on a database of its own: ``CRON_AT_SCALE["DATABASE"] = "jobs"`` (docs/own-database.md).

Runs under ``tests.settings_own_database`` (two aliases, ``default`` and ``jobs``, the router in
``DATABASE_ROUTERS``), not the suite's settings: pytest-django configures Django once per run, so
``test_own_database.py`` runs this file in a pytest of its own::

    python -m pytest tests/acceptance/own_database_cases.py --ds tests.settings_own_database

(the file name does not start with ``test_``: the main run does not collect it). Every table of
the app must be on ``jobs`` and none on ``default``; every write of the API, the dispatcher and a
real ``celery worker`` lands there; the application's own rows (users, the demo task's
``demo_execution``) stay on ``default``.
"""

from __future__ import annotations

import io
import json
from datetime import datetime, timezone

import pytest
from demo.runner import Processes, child_env, database_url, wait_for_workers
from demo.tasks import noop
from django.apps import apps
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connections, transaction
from helpers import wait_until

import cron_at_scale
from cron_at_scale.models import Job, JobAttempt

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True, databases=["default", "jobs"])]

FAR = datetime(2090, 1, 1, tzinfo=timezone.utc)  # a fire time no dispatcher reaches in a test


class Boom(Exception):
    pass


@pytest.fixture(autouse=True, scope="module")
def _own_database_settings():
    if settings.CRON_AT_SCALE.get("DATABASE") != "jobs":
        pytest.fail("run this file with --ds tests.settings_own_database (tests/acceptance/test_own_database.py does)")


def query(alias: str, text: str, params=()):
    with connections[alias].cursor() as cur:
        cur.execute(text, params)
        return cur.fetchall() if cur.description else None


def app_tables(alias: str) -> set[str]:
    rows = query(alias, "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND tablename LIKE %s",
                 ["cron\\_at\\_scale\\_%"])
    return {r[0] for r in rows}


def test_migrate_puts_the_apps_tables_on_jobs_and_none_on_default():
    tables = {m._meta.db_table for m in apps.get_app_config("cron_at_scale").get_models()}
    assert tables <= app_tables("jobs")
    assert app_tables("default") == set()
    assert query("default", "SELECT to_regclass('auth_user') IS NOT NULL") == [(True,)]  # the application's
    trigger = "SELECT count(*) FROM pg_trigger WHERE tgname = 'cron_at_scale_notify_due_v1'"  # wakes dispatchers
    assert (query("jobs", trigger), query("default", trigger)) == ([(1,)], [(0,)])


def test_schedule_schedule_many_and_cancel_write_on_jobs():
    one = cron_at_scale.schedule(noop, at=FAR, key="own-db-one")
    many = cron_at_scale.schedule_many([{"task": noop, "args": [i], "at": FAR} for i in range(3)]
                                       + [{"task": "demo.tasks.noop", "key": "own-db-keyed", "at": FAR}])
    assert cron_at_scale.cancel(one.id)
    rows = dict(query("jobs", "SELECT id, status FROM cron_at_scale_job"))
    assert rows == {one.id: "cancelled", **{job.id: "pending" for job in many}}
    assert {one._state.db, *(job._state.db for job in many)} == {"jobs"}
    assert Job.objects.get(key="own-db-keyed").id == many[-1].id  # the ORM reads there too (the router)
    assert cron_at_scale.schedule(noop, at=FAR, key="own-db-keyed").id == many[-1].id  # idempotent there


def test_schedule_commits_with_a_transaction_on_jobs_not_with_one_on_default():
    with pytest.raises(Boom), transaction.atomic(using="jobs"):
        cron_at_scale.schedule(noop, at=FAR, key="in-jobs")
        raise Boom
    assert not Job.objects.filter(key="in-jobs").exists()
    with pytest.raises(Boom), transaction.atomic(using="default"):
        cron_at_scale.schedule(noop, at=FAR, key="in-default")
        raise Boom
    assert Job.objects.filter(key="in-default").exists()  # the cost of a database of its own: committed anyway


def test_on_commit_with_a_key_schedules_what_the_callers_transaction_commits_once():
    from django.contrib.auth.models import User

    def welcome(user):
        return cron_at_scale.schedule(noop, args=[user.pk], at=FAR, key=f"welcome-{user.pk}")

    def sign_up(name: str, fail: bool = False):
        with transaction.atomic(using="default"):
            user = User.objects.create(username=name)
            transaction.on_commit(lambda: welcome(user), using="default")
            if fail:
                raise Boom
        return user

    with pytest.raises(Boom):
        sign_up("ann", fail=True)
    assert Job.objects.count() == 0  # rolled back: nothing scheduled
    bob = sign_up("bob")
    assert list(Job.objects.values_list("key", flat=True)) == [f"welcome-{bob.pk}"]
    welcome(bob)  # the flow run again after a crash between the two commits: the key keeps one job
    assert Job.objects.count() == 1


def test_a_job_due_now_wakes_a_dispatcher_listening_on_jobs():
    from cron_at_scale.dispatcher.wakeup import Wakeup

    wakeup = Wakeup()
    try:
        assert not wakeup.wait(0.05)  # connected and listening: nothing yet
        cron_at_scale.schedule(noop)  # due now: the trigger on jobs notifies
        assert wakeup.wait(10.0)
    finally:
        wakeup.close()


@pytest.fixture
def processes(broker, tmp_path):
    """Real dispatcher and worker processes on the test databases, under these settings."""
    env = child_env(database_url(connections["default"].settings_dict), settings.CELERY_BROKER_URL,
                    DJANGO_SETTINGS_MODULE="tests.settings_own_database",
                    JOBS_DATABASE_URL=database_url(connections["jobs"].settings_dict))
    procs = Processes(env, log_dir=tmp_path / "logs")
    procs.app = broker
    yield procs
    procs.stop()


def test_a_dispatcher_and_a_worker_fire_jobs_and_record_their_attempts_on_jobs(processes):
    from demo.models import Execution

    processes.worker("w1", concurrency=2)
    wait_for_workers(processes.app, ["w1"])
    jobs = [cron_at_scale.schedule("demo.tasks.record", args=[i]) for i in range(4)]
    jobs.append(cron_at_scale.schedule("demo.tasks.record", countdown=1))  # held for its fire_at (look-ahead)
    processes.dispatcher("d1")
    ids = {job.id for job in jobs}

    def done() -> bool:
        return Job.objects.filter(id__in=ids, status="completed").count() == len(ids)

    wait_until(done, timeout=90, what="the jobs completed on jobs")
    attempts = query("jobs", "SELECT job_id, attempt, outcome, worker <> '' FROM cron_at_scale_jobattempt")
    assert sorted(attempts) == sorted((i, 1, "succeeded", True) for i in ids)
    assert JobAttempt.objects.filter(job_id__in=ids, outcome="succeeded").count() == len(ids)
    # the task's own writes went to the application's database, each run once
    assert sorted(Execution.objects.values_list("job_id", "attempt")) == sorted((i, 1) for i in ids)
    # the worker's health row and the dispatcher's shard leases are on jobs
    wait_until(lambda: query("jobs", "SELECT count(*) FROM cron_at_scale_workerhealth WHERE name LIKE %s",
                             ["w1@%"]) == [(1,)], timeout=30, what="the worker's health row")
    assert query("jobs", "SELECT count(*) > 0 FROM cron_at_scale_shardlease WHERE owner LIKE %s", ["d1%"]) == [(True,)]

    out = io.StringIO()
    call_command("cron_status", "--json", stdout=out)
    status = json.loads(out.getvalue())
    assert status["lag_sample"] >= len(ids) and status["dlq"] == 0
    assert [w["name"].split("@")[0] for w in status["workers"] if w["alive"]] == ["w1"]


def test_cron_status_and_the_admin_read_jobs():
    from django.contrib.auth.models import User
    from django.test import Client

    job = cron_at_scale.schedule(noop, at=FAR, key="own-db-admin")
    out = io.StringIO()
    call_command("cron_status", "--json", stdout=out)
    assert sum(json.loads(out.getvalue())["pending"].values()) == 1

    client = Client()
    client.force_login(User.objects.create_superuser("root", "r@example.com", "x"))  # on default
    r = client.get("/admin/cron_at_scale/job/")
    assert r.status_code == 200
    assert [j.id for j in r.context["cl"].result_list] == [job.id]
    assert client.get(f"/admin/cron_at_scale/job/{job.id}/change/").status_code == 200
    assert client.get("/admin/cron_at_scale/job/dashboard/").status_code == 200


def test_the_paginators_estimate_reads_jobs(monkeypatch):
    from django.contrib.auth.models import User
    from django.test import Client

    from cron_at_scale import admin as jobadmin

    cron_at_scale.schedule_many([{"task": noop, "args": [i], "at": FAR} for i in range(8)])
    query("jobs", "ANALYZE cron_at_scale_job")
    monkeypatch.setattr(jobadmin, "EXACT_COUNT_LIMIT", 5)  # beyond it, the planner's estimate (raw SQL)
    client = Client()
    client.force_login(User.objects.create_superuser("root", "r@example.com", "x"))
    r = client.get("/admin/cron_at_scale/job/")
    assert r.status_code == 200
    assert r.context["cl"].paginator.count >= 6


def test_cron_import_beat_reads_default_and_writes_jobs_and_a_dry_run_writes_neither():
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    every = IntervalSchedule.objects.create(every=3600, period="seconds")  # on default: not the app's model
    PeriodicTask.objects.create(name="hourly", task="demo.tasks.noop", interval=every)
    call_command("cron_import_beat", "--dry-run", "--disable-source", stdout=io.StringIO())
    assert not Job.objects.exists() and PeriodicTask.objects.get(name="hourly").enabled
    call_command("cron_import_beat", "--disable-source", stdout=io.StringIO())
    assert query("jobs", "SELECT key, interval FROM cron_at_scale_job") == [("django_celery_beat:hourly", 3600.0)]
    assert not PeriodicTask.objects.get(name="hourly").enabled


def test_the_metrics_read_jobs():
    from django.test import Client

    cron_at_scale.schedule(noop, countdown=600)
    text = Client().get("/metrics").content.decode()
    assert "cron_database_up 1.0" in text  # 0 where a statement failed: no table on default
    assert 'cron_jobs_pending{bucket="next_hour"} 1.0' in text


def check_errors(**kw) -> str:
    with pytest.raises(SystemCheckError) as e:
        call_command("check", **kw)
    return str(e.value)


def test_check_passes_here_and_names_an_unknown_alias_and_a_missing_router(settings):
    call_command("check", databases=["jobs"])
    settings.CRON_AT_SCALE = {**settings.CRON_AT_SCALE, "DATABASE": "nope"}
    text = check_errors()
    assert "cron_at_scale.E001" in text and "'nope'" in text
    settings.CRON_AT_SCALE = {**settings.CRON_AT_SCALE, "DATABASE": "jobs"}
    settings.DATABASE_ROUTERS = []
    text = check_errors()
    assert "cron_at_scale.E006" in text and "CRON_AT_SCALE['DATABASE']" in text
