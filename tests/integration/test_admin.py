"""The jobs admin on PostgreSQL: bounded counts, indexed search, no N+1, actions gated by permissions."""

from __future__ import annotations

import json
import re

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


def test_rows_say_key_task_queue_and_the_ids_tail_and_any_part_of_an_id_finds_it(superuser_client):
    """UUIDv7 ids of one minute share their first characters: the list shows each id's random tail,
    and a search by that tail, by the start of an id (a primary-key range) or by a key finds it."""
    a = cron_at_scale.schedule(noop, countdown=3600, key="invoice-17", queue="emails")
    b = cron_at_scale.schedule(noop, countdown=3600)
    page = superuser_client.get(URL).content.decode()
    tail = str(a.id)[-jobadmin.ID_TAIL:]
    assert f"…{tail}" in page and "invoice-17" in page and "emails" in page and "(default)" in page
    assert str(a.id)[:8] == str(b.id)[:8]  # why the start says nothing
    assert listed(superuser_client.get(URL + f"?q={tail}")) == [a.id]
    r = superuser_client.get(URL + f"?q={str(a.id)[-6:]}")
    assert listed(r) == [a.id] and "latest 100,000 jobs" in r.content.decode()  # a bounded scan, said
    prefix = str(b.id)[:23]
    assert set(listed(superuser_client.get(URL + f"?q={prefix}"))) >= {b.id}
    assert listed(superuser_client.get(URL + "?q=invoice-")) == [a.id]


def test_default_order_puts_late_then_failed_then_running_then_next_due_on_every_page(superuser_client, monkeypatch):
    """The attention order, read segment by segment across pages (2 rows a page): late (oldest
    first), failed (newest first), running, next due (soonest first), paused, completed."""
    monkeypatch.setattr(jobadmin.JobAdmin, "list_per_page", 2)
    made = {name: cron_at_scale.schedule(noop, countdown=600 + i) for i, name in enumerate(
        ["late_old", "late_new", "failed_old", "failed_new", "running", "next_soon", "next_later", "done"])}
    ids = {k: v.id for k, v in made.items()}
    sql("UPDATE cron_at_scale_job SET fire_at = now() - interval '2 hours' WHERE id = %s", [ids["late_old"]])
    sql("UPDATE cron_at_scale_job SET fire_at = now() - interval '1 hour' WHERE id = %s", [ids["late_new"]])
    sql("UPDATE cron_at_scale_job SET status = 'failed', fire_at = now() - interval '3 hours' WHERE id = %s",
        [ids["failed_old"]])
    sql("UPDATE cron_at_scale_job SET status = 'failed', fire_at = now() - interval '1 minute' WHERE id = %s",
        [ids["failed_new"]])
    sql("UPDATE cron_at_scale_job SET status = 'in_progress' WHERE id = %s", [ids["running"]])
    sql("UPDATE cron_at_scale_job SET status = 'completed', fire_at = now() - interval '1 day' WHERE id = %s",
        [ids["done"]])
    expected = [ids[k] for k in ["late_old", "late_new", "failed_new", "failed_old", "running", "next_soon",
                                 "next_later", "done"]]
    # few rows: the database sorts them (the CASE)
    order = []
    for p in range(1, 5):
        order += listed(superuser_client.get(URL + f"?p={p}"))
    assert order == expected
    # many rows (beyond the exact count): read segment by segment, each an index range
    monkeypatch.setattr(jobadmin, "EXACT_COUNT_LIMIT", 3)
    sql("ANALYZE cron_at_scale_job")
    order = []
    for p in range(1, 5):
        order += listed(superuser_client.get(URL + f"?p={p}"))
    assert order == expected
    # ... and under another filter, by fire time (the planner would read that filter's whole index per segment)
    r = superuser_client.get(URL + "?task=demo.tasks.noop")
    assert listed(r)[:2] == [ids["next_later"], ids["next_soon"]]
    # a click on "next fire" orders by fire_at alone: the status ranges merged; its count sorts nothing
    with CaptureQueriesContext(connection) as queries:
        assert listed(superuser_client.get(URL + "?o=-7")) == [ids["next_later"], ids["next_soon"]]
    counts = [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"].upper()]
    assert counts and not any("ORDER BY" in q.upper() for q in counts), counts
    assert listed(superuser_client.get(URL + "?o=7")) == [ids["done"], ids["failed_old"]]


def test_a_late_job_says_how_late_and_why(superuser_client, settings):
    settings.CRON_AT_SCALE = {**settings.CRON_AT_SCALE, "HOLD_UNCONSUMED_QUEUES": True}
    job = cron_at_scale.schedule("demo.tasks.record", countdown=3600, queue="emails")
    sql("UPDATE cron_at_scale_job SET fire_at = now() - interval '5 minutes' WHERE id = %s", [job.id])
    page = superuser_client.get(URL).content.decode()
    assert "5 min" in page and "cas-status-late" in page
    assert "queue emails HELD: no consumer" in page  # no worker consumes emails here, as cron_status says
    one = superuser_client.get(URL + f"{job.id}/change/").content.decode()
    assert "late by 5 min" in one and "queue emails HELD: no consumer" in one
    dash = superuser_client.get(URL + "dashboard/").content.decode()
    assert "HELD: no consumer" in dash and f"…{str(job.id)[-12:]}" in dash
    assert "?due=late" in dash and "?lease=expired" in dash and "?status__exact=paused" in dash
    assert listed(superuser_client.get(URL + "?due=late")) == [job.id]
    assert listed(superuser_client.get(URL + "?due=hour")) == []


def test_job_page_buttons_run_the_actions_on_that_job(superuser_client):
    recurring = cron_at_scale.schedule(noop, cron="0 0 1 1 *")
    page = superuser_client.get(URL + f"{recurring.id}/change/").content.decode()
    for name in ("run_jobs_now", "pause_jobs", "cancel_jobs"):
        assert f"/act/{name}/" in page, name
    assert "/act/requeue_jobs/" not in page and "/act/resume_jobs/" not in page
    r = superuser_client.post(URL + f"{recurring.id}/act/pause_jobs/", follow=True)
    assert r.redirect_chain[-1][0].endswith(f"{recurring.id}/change/")
    assert Job.objects.get(id=recurring.id).status == "paused" and "Paused 1 of 1" in r.content.decode()
    r = superuser_client.post(URL + f"{recurring.id}/act/resume_jobs/")
    assert "What should happen to the occurrences" in r.content.decode()
    superuser_client.post(URL + f"{recurring.id}/act/resume_jobs/",
                          {"_selected_action": [str(recurring.id)], "post": "yes", "missed": "skip"})
    assert Job.objects.get(id=recurring.id).status == "pending"
    viewer = staff_client("view_job")
    assert "/act/" not in viewer.get(URL + f"{recurring.id}/change/").content.decode()
    assert viewer.post(URL + f"{recurring.id}/act/cancel_jobs/").status_code == 403
    assert Job.objects.get(id=recurring.id).status == "pending"


def test_a_beat_job_is_marked_as_the_beat_schedules_and_its_schedule_edit_is_refused(superuser_client):
    beat = cron_at_scale.schedule(noop, cron="*/5 * * * *", key="beat:cleanup")
    own = cron_at_scale.schedule(noop, cron="*/5 * * * *", key="mine")
    assert 'class="cas-beat"' in superuser_client.get(URL).content.decode()
    page = superuser_client.get(URL + f"{beat.id}/change/").content.decode()
    assert "Owned by the beat schedule" in page and 'name="cron_expr"' not in page
    assert 'name="cron_expr"' in superuser_client.get(URL + f"{own.id}/change/").content.decode()
    superuser_client.post(URL + f"{beat.id}/change/", {"cron_expr": "0 * * * *", "timezone": "UTC"})
    assert Job.objects.get(id=beat.id).cron_expr == "*/5 * * * *"


def test_a_job_moved_to_the_history_is_found_from_its_old_page(superuser_client):
    from cron_at_scale.maintenance import archive

    archive.keep_partitions(86400, None)
    job = cron_at_scale.schedule(noop, key="nightly-report-2026-12-05")
    JobAttempt.objects.create(job_id=job.id, attempt=1, scheduled_at=job.fire_at, outcome="succeeded",
                              finished_at=job.fire_at)
    Job.objects.filter(id=job.id).update(status="completed")
    assert archive.move(0) == (1, False)
    r = superuser_client.get(f"/admin/cron_at_scale/job/{job.id}/change/", follow=True)
    assert r.redirect_chain[-1][0] == f"/admin/cron_at_scale/jobhistory/{job.id}/change/"
    assert r.status_code == 200 and "nightly-report-2026-12-05" in r.content.decode()
    for url in (f"/admin/cron_at_scale/jobhistory/?q={job.id}", "/admin/cron_at_scale/jobhistory/?q=nightly-report-2026-12-05",
                f"/admin/cron_at_scale/attempthistory/?job_id={job.id}"):
        r = superuser_client.get(url)
        assert r.status_code == 200 and len(r.context["cl"].result_list) == 1, url
    assert superuser_client.get("/admin/cron_at_scale/jobhistory/add/").status_code == 403


def test_the_lease_and_missed_filters_list_the_rows_they_name(superuser_client):
    expired = cron_at_scale.schedule(noop, countdown=60)
    renewed = cron_at_scale.schedule(noop, countdown=60)
    sql("UPDATE cron_at_scale_job SET status = 'in_progress', locked_until = now() - interval '5 seconds' "
        "WHERE id = %s", [expired.id])
    sql("UPDATE cron_at_scale_job SET status = 'in_progress', locked_until = now() + interval '50 seconds' "
        "WHERE id = %s", [renewed.id])
    assert listed(superuser_client.get(URL + "?lease=expired")) == [expired.id]
    missed = cron_at_scale.schedule(noop, cron="*/5 * * * *")
    cron_at_scale.schedule(noop, cron="*/10 * * * *")
    sql("UPDATE cron_at_scale_job SET missed_occurrences = 2 WHERE id IN (%s, %s)", [missed.id, expired.id])
    assert listed(superuser_client.get(URL + "?missed=yes")) == [missed.id]  # recurring jobs only


def test_an_action_on_more_jobs_than_the_limit_is_refused_and_changes_nothing(superuser_client, monkeypatch):
    monkeypatch.setattr(jobadmin, "MAX_ACTION_JOBS", 2)
    jobs = [cron_at_scale.schedule(noop, countdown=600) for _ in range(3)]
    r = superuser_client.post(URL, {"action": "cancel_jobs", "_selected_action": [str(j.id) for j in jobs]},
                              follow=True)
    assert "More than 2 jobs selected" in r.content.decode()
    assert set(Job.objects.filter(id__in=[j.id for j in jobs]).values_list("status", flat=True)) == {"pending"}
    r = superuser_client.post(URL, {"action": "cancel_jobs", "_selected_action": [str(j.id) for j in jobs[:2]]},
                              follow=True)
    assert Job.objects.filter(id__in=[j.id for j in jobs], status="cancelled").count() == 2


def test_the_dashboard_says_which_workers_are_alive_stuck_or_gone(superuser_client):
    from cron_at_scale.models import WorkerHealth

    WorkerHealth.objects.create(name="ok@box", pid=1, queues=["celery"], concurrency=2)
    WorkerHealth.objects.create(name="stuck@box", pid=2, queues=["emails"], concurrency=2, state="stuck")
    WorkerHealth.objects.create(name="gone@box", pid=3, queues=["celery"], concurrency=2)
    sql("UPDATE cron_at_scale_workerhealth SET last_seen = now() - interval '10 minutes' WHERE name = 'gone@box'")
    page = superuser_client.get(URL + "dashboard/").content.decode()
    rows = {name: page.split(f"<td>{name}</td>", 1)[1].split("</tr>", 1)[0] for name in ("ok@box", "stuck@box", "gone@box")}
    assert "alive" in rows["ok@box"] and "cas-bad" not in rows["ok@box"]
    assert '<span class="cas-bad">stuck</span>' in rows["stuck@box"]
    assert "gone (last seen 600 s ago)" in rows["gone@box"]


def test_pending_lists_read_each_shards_range_of_the_claims_index_beside_many_pending(superuser_client, monkeypatch):
    """The admin's pending lists (the late and next-due segments of the default order, the due filter,
    the pending filter in fire time order) read the claim's (shard, fire_at) index shard by shard: in
    order, about a page of it, never the whole of it and never the table."""
    sql("""INSERT INTO cron_at_scale_job (id, fire_at, task, payload, options)
           SELECT gen_random_uuid(), statement_timestamp() + interval '2 hours' + g * interval '1 second',
                  'demo.tasks.noop', '{}', '{}'
           FROM generate_series(1, 30000) AS g""")
    sql("""INSERT INTO cron_at_scale_job (id, fire_at, task, payload, options)
           SELECT gen_random_uuid(), statement_timestamp() - g * interval '1 second', 'demo.tasks.noop', '{}', '{}'
           FROM generate_series(1, 300) AS g""")
    sql("ANALYZE cron_at_scale_job")
    pending = [r[0] for r in sql("SELECT id FROM cron_at_scale_job ORDER BY fire_at, id")]
    monkeypatch.setattr(jobadmin.JobAdmin, "list_per_page", 50)
    pages = {"?p=7": pending[300:350],  # past the 300 late ones (6 pages): the next due, soonest first
             "?due=late&p=2": pending[50:100], "?status__exact=pending&o=7&p=3": pending[100:150],
             "?status__exact=pending&o=-7": pending[::-1][:50]}
    for query, want in pages.items():
        with CaptureQueriesContext(connection) as queries:
            assert listed(superuser_client.get(URL + query)) == want, query
        for q in queries.captured_queries:
            if "cron_at_scale_job" not in q["sql"] or "'pending'" not in q["sql"] or "COUNT(" in q["sql"].upper() \
                    or q["sql"].startswith("EXPLAIN"):
                continue
            (plan,), = sql("EXPLAIN (ANALYZE, FORMAT JSON) " + q["sql"])
            text = json.dumps(plan)
            assert '"Seq Scan"' not in text, (query, q["sql"][:300])
            read = sum(int(n) for n in re.findall(r'"Actual Rows": (\d+)', text))
            assert read < 15_000, (query, q["sql"][:300], read)  # 30,300 pending: never all of them
