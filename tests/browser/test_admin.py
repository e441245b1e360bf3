"""The operator's errands in the jobs admin, in a real browser (headless Chromium): find a late
job and see why, cancel, requeue a failed job, pause and resume choosing what to do with the
missed runs, run now. ``ADMIN_SCREENSHOTS=docs`` saves the docs' screenshots on the way."""

from __future__ import annotations

from contextlib import contextmanager
from datetime import timedelta

import pytest

pytest.importorskip("selenium", reason="the browser tests need selenium (pip install -e '.[dev]')")

from helpers import sql  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.expected_conditions import staleness_of  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

import cron_at_scale  # noqa: E402
from browser.conftest import screenshot  # noqa: E402
from cron_at_scale.models import Job, JobAttempt, WorkerHealth  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
JOBS = "/admin/cron_at_scale/job/"


def scene() -> dict[str, Job]:
    """A few of each kind of row an operator meets: late jobs behind a queue nobody consumes
    (``emails``) and behind no dispatcher (the default queue), a failed one, a running one, jobs due
    later, recurring jobs (one of them the beat schedule's), a paused and a completed one."""
    jobs = {}
    for i in range(3):
        jobs[f"late_email_{i}"] = cron_at_scale.schedule("demo.tasks.record", args=[f"welcome-{i}"], countdown=60,
                                                         queue="emails", key=f"welcome-mail-{i}")
    jobs["late_default"] = cron_at_scale.schedule("demo.tasks.noop", countdown=60, key="nightly-export")
    jobs["failed"] = cron_at_scale.schedule("demo.tasks.record", args=["invoice-42"], countdown=60, key="invoice-42")
    jobs["running"] = cron_at_scale.schedule("demo.tasks.noop", countdown=60, key="reindex-search")
    for i in range(4):
        jobs[f"later_{i}"] = cron_at_scale.schedule("demo.tasks.record", args=[i], countdown=600 * (i + 1),
                                                    key=f"reminder-{i}")
    jobs["cron"] = cron_at_scale.schedule("demo.tasks.noop", cron="*/15 * * * *", tz="Europe/Paris",
                                          key="report-quarter-hour")
    jobs["beat"] = cron_at_scale.schedule("demo.tasks.noop", cron="0 3 * * *", key="beat:cleanup-sessions")
    jobs["interval"] = cron_at_scale.schedule("demo.tasks.noop", every=30)
    jobs["paused"] = cron_at_scale.schedule("demo.tasks.noop", cron="0 * * * *", key="hourly-digest")
    cron_at_scale.pause(jobs["paused"].id, "paused in the admin by operator")
    jobs["done"] = cron_at_scale.schedule("demo.tasks.noop", countdown=60, key="welcome-mail-old")
    for i, name in enumerate(["late_email_0", "late_email_1", "late_email_2"]):
        sql("UPDATE cron_at_scale_job SET fire_at = now() - make_interval(secs => %s) WHERE id = %s",
            [1200 - 300 * i, jobs[name].id])
    sql("UPDATE cron_at_scale_job SET fire_at = now() - interval '95 seconds' WHERE id = %s", [jobs["late_default"].id])
    sql("""UPDATE cron_at_scale_job SET status = 'failed', retries = 3, attempts = 4,
           fire_at = now() - interval '40 minutes', created_at = now() - interval '41 minutes' WHERE id = %s""",
        [jobs["failed"].id])
    first = Job.objects.get(id=jobs["failed"].id).fire_at
    for n, after in enumerate((0, 30, 150, 750), start=1):  # the default backoff: 30 s, 2 min, 10 min
        at = first + timedelta(seconds=after)
        JobAttempt.objects.create(job_id=jobs["failed"].id, attempt=n, scheduled_at=at, started_at=at,
                                  finished_at=at + timedelta(seconds=0.2), worker="w1@box:4242",
                                  outcome="failed" if n == 4 else "retried",
                                  error="ConnectionError: smtp.example.com:25 refused")
    sql("""UPDATE cron_at_scale_job SET status = 'in_progress', attempts = 1, locked_by = 'w1@box:4243',
           locked_until = now() + interval '50 seconds', fire_at = now() - interval '10 seconds'
           WHERE id = %s""", [jobs["running"].id])
    sql("UPDATE cron_at_scale_job SET status = 'completed', attempts = 1, fire_at = now() - interval '2 hours' "
        "WHERE id = %s", [jobs["done"].id])
    WorkerHealth.objects.create(name="w1@box", pid=4242, queues=["celery"], concurrency=4, running=1, received=120)
    return {k: Job.objects.get(id=v.id) for k, v in jobs.items()}


def messages(driver) -> str:
    return " ".join(e.text for e in driver.find_elements(By.CSS_SELECTOR, "ul.messagelist li"))


def open_job(driver, job: Job) -> None:
    driver.get(driver.base + JOBS + f"{job.id}/change/")
    driver.find_element(By.CSS_SELECTOR, "div.field-summary")


@contextmanager
def navigation(driver):
    """Wait, after the block, for the page it leads to: read at once, the elements of the page the
    block clicked on are still there while the next one loads."""
    page = driver.find_element(By.TAG_NAME, "html")
    yield
    WebDriverWait(driver, 30).until(staleness_of(page))
    driver.find_element(By.ID, "content")


def follow(driver, element) -> None:
    """Click ``element`` and wait for the page it leads to."""
    with navigation(driver):
        element.click()


def press(driver, action: str) -> None:
    """Click the job page's button for ``action`` and wait for the page it leads to."""
    follow(driver, driver.find_element(By.CSS_SELECTOR, f"button.cas-act-{action}"))


def test_find_a_late_job_and_see_why(admin):
    jobs = scene()
    admin.get(admin.base + JOBS + "dashboard/")
    queues = admin.find_element(By.CSS_SELECTOR, "table.cas-queues").text
    assert "HELD: no consumer" in queues and "emails" in queues, queues
    assert "w1@box" in admin.find_element(By.CSS_SELECTOR, "table.cas-workers").text
    screenshot(admin, "admin_dashboard")
    follow(admin, admin.find_element(By.CSS_SELECTOR, "div.cas-figure a[href$='?due=late']"))  # the "late" figure opens its list
    rows = admin.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    assert len(rows) == 4  # the three e-mails and the export, nothing else
    first = rows[0]
    assert first.find_element(By.CSS_SELECTOR, "td.field-name").text == "welcome-mail-0"  # the most late first
    why = first.find_element(By.CSS_SELECTOR, "td.field-late_by").text
    assert "20 min" in why and "queue emails HELD: no consumer" in why, why
    assert "no dispatcher alive" in rows[3].find_element(By.CSS_SELECTOR, "td.field-late_by").text
    follow(admin, first.find_element(By.CSS_SELECTOR, "th.field-short_id a"))
    summary = admin.find_element(By.CSS_SELECTOR, "div.field-summary").text
    assert "late by 20 min" in summary and "queue emails HELD: no consumer" in summary, summary
    admin.get(admin.base + JOBS)  # the whole list: what needs attention first
    names = [e.text for e in admin.find_elements(By.CSS_SELECTOR, "#result_list tbody td.field-name")]
    assert names[:6] == ["welcome-mail-0", "welcome-mail-1", "welcome-mail-2", "nightly-export", "invoice-42",
                         "reindex-search"], names
    assert str(jobs["failed"].id)[-12:] in admin.find_element(By.ID, "result_list").text
    screenshot(admin, "admin_changelist")


def test_cancel_a_job_from_its_page(admin):
    job = scene()["later_1"]
    open_job(admin, job)
    press(admin, "cancel_jobs")
    assert "Cancelled 1 of 1 selected job" in messages(admin)
    assert Job.objects.get(id=job.id).status == "cancelled"
    assert not admin.find_elements(By.CSS_SELECTOR, "button.cas-act-cancel_jobs")  # nothing left to cancel


def test_requeue_a_failed_job_found_by_the_tail_of_its_id(admin):
    job = scene()["failed"]
    admin.get(admin.base + JOBS)
    box = admin.find_element(By.ID, "searchbar")
    with navigation(admin):
        box.send_keys(str(job.id)[-12:] + Keys.ENTER)
    rows = admin.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    assert len(rows) == 1 and "invoice-42" in rows[0].text
    follow(admin, rows[0].find_element(By.CSS_SELECTOR, "th.field-short_id a"))
    assert "ConnectionError: smtp.example.com:25 refused" in admin.find_element(By.CSS_SELECTOR,
                                                                                 "div.field-attempt_history").text
    assert "failed after 4 attempts (3 retries): ConnectionError" in admin.find_element(
        By.CSS_SELECTOR, "div.field-summary").text
    screenshot(admin, "admin_job")
    press(admin, "requeue_jobs")
    assert "Requeued 1 of 1 selected job" in messages(admin)
    row = Job.objects.get(id=job.id)
    assert (row.status, row.retries) == ("pending", 0)


def test_pause_then_resume_choosing_to_skip_the_missed_runs(admin):
    job = scene()["cron"]
    open_job(admin, job)
    press(admin, "pause_jobs")
    assert "Paused 1 of 1" in messages(admin) and Job.objects.get(id=job.id).status == "paused"
    # paused for an hour: four quarter-hours fell due meanwhile
    sql("UPDATE cron_at_scale_job SET fire_at = fire_at - interval '1 hour', occurrence_at = occurrence_at - "
        "interval '1 hour' WHERE id = %s", [job.id])
    open_job(admin, job)
    press(admin, "resume_jobs")
    assert "What should happen to the occurrences" in admin.find_element(By.ID, "content").text
    admin.find_element(By.CSS_SELECTOR, "input[name=missed][value=skip]").click()
    follow(admin, admin.find_element(By.CSS_SELECTOR, "input[type=submit][value=Resume]"))
    assert "Resumed 1 of 1" in messages(admin)
    row = Job.objects.get(id=job.id)
    ((now,),) = sql("SELECT statement_timestamp()")
    assert row.status == "pending" and row.fire_at > now  # skipped: the next future quarter-hour
    assert row.missed_occurrences >= 1


def test_run_now_makes_a_future_job_due(admin):
    job = scene()["later_3"]
    open_job(admin, job)
    press(admin, "run_jobs_now")
    assert "Made due now 1 of 1" in messages(admin)
    ((now,),) = sql("SELECT statement_timestamp()")
    assert Job.objects.get(id=job.id).fire_at <= now
    assert "late by" in admin.find_element(By.CSS_SELECTOR, "div.field-summary").text  # due, no dispatcher here


def test_sort_by_next_fire_and_page_through(admin, monkeypatch):
    """A click on "next fire" lists every job by fire time, soonest first, over pages; a second click
    turns it round. Beyond the exact count the list merges each status's index range."""
    from cron_at_scale import admin as jobadmin

    monkeypatch.setattr(jobadmin.JobAdmin, "list_per_page", 6)
    monkeypatch.setattr(jobadmin, "EXACT_COUNT_LIMIT", 3)
    scene()
    sql("ANALYZE cron_at_scale_job")  # the page count beyond the exact count is the planner's estimate
    by_time = [str(j.id)[-12:] for j in Job.objects.order_by("fire_at", "id")]
    admin.get(admin.base + JOBS)
    follow(admin, admin.find_element(By.CSS_SELECTOR, "th.column-next_fire div.text a"))

    def shown() -> list[str]:
        return [e.text.lstrip("…") for e in admin.find_elements(By.CSS_SELECTOR, "#result_list tbody th.field-short_id")]

    seen = shown()
    follow(admin, next(a for a in admin.find_elements(By.CSS_SELECTOR, ".paginator a") if a.text == "2"))
    seen += shown()
    assert seen == by_time[:12], (seen, by_time)
    screenshot(admin, "admin_next_fire")
    admin.get(admin.base + JOBS + "?o=7")
    follow(admin, admin.find_element(By.CSS_SELECTOR, "th.column-next_fire div.text a"))  # again: latest first
    assert shown() == by_time[::-1][:6]
