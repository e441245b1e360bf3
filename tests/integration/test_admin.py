"""The jobs admin on PostgreSQL: bounded counts, indexed search, no N+1, actions gated by permissions."""

from __future__ import annotations

import pytest
from demo.tasks import noop
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from helpers import sql

import cron_at_scale
from cron_at_scale import admin as jobadmin
from cron_at_scale.models import Job, JobAttempt

pytestmark = pytest.mark.django_db
URL = "/admin/cron_at_scale/job/"


@pytest.fixture
def superuser_client():
    c = Client()
    c.force_login(User.objects.create_superuser("root", "r@example.com", "x"))
    return c


def staff_client(*perms: str) -> Client:
    user = User.objects.create_user(f"staff{User.objects.count()}", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="cron_at_scale", codename__in=perms))
    c = Client()
    c.force_login(user)
    return c


def offered(response) -> list[str]:
    form = response.context["action_form"]  # None when no action is offered at all
    return [] if form is None else [name for name, _ in form.fields["action"].choices]


def listed(response) -> list:
    return [job.id for job in response.context["cl"].result_list]


def test_changelist_filters_search_and_pages(superuser_client):
    a = cron_at_scale.schedule(noop, countdown=3600, key="order-17")
    b = cron_at_scale.schedule("demo.tasks.record", countdown=60, queue="emails")
    c = cron_at_scale.schedule(noop, cron="*/5 * * * *", tz="Europe/Paris")
    sql("UPDATE cron_at_scale_job SET status = 'failed' WHERE id = %s", [b.id])
    r = superuser_client.get(URL)
    assert r.status_code == 200
    assert set(listed(r)) == {a.id, b.id, c.id}
    assert "cron */5 * * * * (Europe/Paris)" in r.content.decode()
    assert listed(superuser_client.get(URL + "?status__exact=failed")) == [b.id]
    assert listed(superuser_client.get(URL + "?schedule_type__exact=cron")) == [c.id]
    assert listed(superuser_client.get(URL + "?task=demo.tasks.record")) == [b.id]
    assert listed(superuser_client.get(URL + "?queue=emails")) == [b.id]
    assert set(listed(superuser_client.get(URL + "?queue="))) == {a.id, c.id}  # the default queue
    assert listed(superuser_client.get(URL + f"?q={a.id}")) == [a.id]
    assert listed(superuser_client.get(URL + f"?q={a.id}:3")) == [a.id]  # a Celery task id
    assert listed(superuser_client.get(URL + "?q=order-1")) == [a.id]  # key prefix
    assert listed(superuser_client.get(URL + "?q=rder")) == []  # never a LIKE '%…%' scan
    filters = r.content.decode()
    assert "demo.tasks.record" in filters and "emails" in filters  # task and queue filter choices
    assert "(default)" in filters


def test_no_unbounded_count_and_no_n_plus_one(superuser_client):
    cron_at_scale.schedule_many([{"task": noop, "countdown": 60}] * 3)
    with CaptureQueriesContext(connection) as few:
        superuser_client.get(URL)
    cron_at_scale.schedule_many([{"task": noop, "countdown": 60}] * 60)
    with CaptureQueriesContext(connection) as many:
        superuser_client.get(URL)
    assert len(many.captured_queries) == len(few.captured_queries)
    counts = [q["sql"] for q in many.captured_queries if "COUNT(" in q["sql"].upper()]
    assert counts and all("LIMIT" in q for q in counts), counts


def test_paginator_takes_the_planner_estimate_beyond_the_exact_limit(superuser_client, monkeypatch):
    monkeypatch.setattr(jobadmin, "EXACT_COUNT_LIMIT", 5)
    cron_at_scale.schedule_many([{"task": noop, "countdown": 60}] * 12)
    sql("ANALYZE cron_at_scale_job")
    r = superuser_client.get(URL + "?status__exact=pending")
    assert r.context["cl"].result_count >= 6  # bounded count (6 rows read), then the estimate
    assert len(listed(r)) == 12


def test_job_page_shows_attempts_and_their_task_result(superuser_client):
    from django_celery_results.models import TaskResult

    job = cron_at_scale.schedule(noop)
    sql("""INSERT INTO cron_at_scale_jobattempt (job_id, attempt, scheduled_at, started_at, finished_at, worker,
                                                 outcome, error)
           VALUES (%s, 1, now(), now(), now(), 'w1:42', 'failed', 'ValueError: boom'),
                  (%s, 2, now(), now(), NULL, 'w2:43', 'running', '')""", [job.id, job.id])
    result = TaskResult.objects.create(task_id=f"{job.id}:1", status="FAILURE")
    r = superuser_client.get(URL + f"{job.id}/change/")
    page = r.content.decode()
    assert r.status_code == 200
    assert "ValueError: boom" in page and "w2:43" in page and "running" in page
    assert f"/admin/django_celery_results/taskresult/{result.pk}/change/" in page
    assert superuser_client.get(URL + "dashboard/").status_code == 200


def test_actions_need_their_permission_and_a_forged_post_is_refused():
    job = cron_at_scale.schedule(noop, countdown=3600)
    viewer = staff_client("view_job")
    r = viewer.get(URL)
    assert r.status_code == 200
    assert not {"cancel_jobs", "run_jobs_now", "requeue_jobs", "pause_jobs", "resume_jobs"} & set(offered(r))
    for action in ("cancel_jobs", "run_jobs_now"):
        viewer.post(URL, {"action": action, "_selected_action": [str(job.id)]})
    row = Job.objects.get(id=job.id)
    assert row.status == "pending" and row.fire_at == job.fire_at

    canceller = staff_client("view_job", "cancel_job")
    choices = offered(canceller.get(URL))
    assert "cancel_jobs" in choices and "requeue_jobs" not in choices
    canceller.post(URL, {"action": "cancel_jobs", "_selected_action": [str(job.id)]})
    assert Job.objects.get(id=job.id).status == "cancelled"


def test_run_now_requeue_pause_resume(superuser_client):
    once = cron_at_scale.schedule(noop, countdown=3600)
    recurring = cron_at_scale.schedule(noop, cron="0 0 1 1 *")
    failed = cron_at_scale.schedule(noop)
    sql("UPDATE cron_at_scale_job SET status = 'failed', retries = 3 WHERE id = %s", [failed.id])

    def act(action, *jobs):
        return superuser_client.post(URL, {"action": action, "_selected_action": [str(j.id) for j in jobs]}, follow=True)

    act("run_jobs_now", once, recurring, failed)
    (db_now,), = sql("SELECT statement_timestamp()")
    assert Job.objects.get(id=once.id).fire_at <= db_now
    rec = Job.objects.get(id=recurring.id)
    assert rec.fire_at <= db_now and rec.occurrence_at == recurring.occurrence_at  # one extra run, schedule kept
    assert Job.objects.get(id=failed.id).status == "failed"
    r = act("requeue_jobs", failed, once)
    assert Job.objects.get(id=failed.id).status == "pending"
    assert "Requeued 1 of 2" in r.content.decode()
    act("pause_jobs", recurring, once)
    assert (Job.objects.get(id=recurring.id).status, Job.objects.get(id=once.id).status) == ("paused", "pending")
    assert "paused in the admin by root" in Job.objects.get(id=recurring.id).pause_note
    act("resume_jobs", recurring)  # asks what to do with the missed occurrences first
    assert Job.objects.get(id=recurring.id).status == "paused"
    superuser_client.post(URL, {"action": "resume_jobs", "_selected_action": [str(recurring.id)], "post": "yes",
                                "missed": ""})
    assert Job.objects.get(id=recurring.id).status == "pending"


def test_attempt_log_admin_is_read_only_and_filterable_by_job(superuser_client):
    job = cron_at_scale.schedule(noop)
    JobAttempt.objects.create(job_id=job.id, attempt=1, scheduled_at=job.fire_at)
    r = superuser_client.get(f"/admin/cron_at_scale/jobattempt/?job__id__exact={job.id}")
    assert r.status_code == 200 and len(r.context["cl"].result_list) == 1
    assert superuser_client.get("/admin/cron_at_scale/job/add/").status_code == 403


def test_job_page_previews_the_next_fires_of_a_quartz_form(superuser_client):
    """The change page lists a cron job's next fires in its zone: ``0 2 L * *`` in Berlin gives the
    last day of each month (checked against the calendar), at 02:00 local time."""
    import calendar
    from zoneinfo import ZoneInfo

    job = cron_at_scale.schedule(noop, cron="0 2 L * *", tz="Europe/Berlin")
    lines = jobadmin.next_fires_text(Job.objects.get(id=job.id))
    assert len(lines) == jobadmin.NEXT_FIRES_SHOWN
    local = Job.objects.get(id=job.id).occurrence_at.astimezone(ZoneInfo("Europe/Berlin"))
    assert local.day == calendar.monthrange(local.year, local.month)[1]
    for line in lines:
        day = line.split()[1]
        y, m, d = (int(x) for x in day.split("-"))
        assert d == calendar.monthrange(y, m)[1], line
    page = superuser_client.get(URL + f"{job.id}/change/").content.decode()
    assert "Next 5 fires" in page, page
    assert all(line in page for line in lines), page
    once = cron_at_scale.schedule(noop, countdown=60)
    assert jobadmin.next_fires_text(Job.objects.get(id=once.id)) == []
