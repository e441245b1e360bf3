"""Overdue recurring jobs (cron_at_scale.maintenance.overdue), in process on PostgreSQL.

Time is moved by moving the jobs' times into the past (as tests/integration/test_dispatcher_advance.py
does), never by sleeping. The end-to-end run with real processes is
tests/acceptance/test_maintenance_overdue.py; bounded run history is tests/integration/test_maintenance_history.py.
"""

from __future__ import annotations

import json
from io import StringIO

import pytest
from demo.tasks import noop
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from helpers import YEARLY, due, sql

import cron_at_scale
from cron_at_scale import ValidationError, conf
from cron_at_scale.dispatcher import Dispatcher
from cron_at_scale.maintenance import history
from cron_at_scale.maintenance.overdue import OverdueWatch, overdue_jobs
from cron_at_scale.models import Job
from cron_at_scale.ops import metrics
from cron_at_scale.ops.status import snapshot
from cron_at_scale.signals import job_overdue, job_recovered
from cron_at_scale.sql import run as run_query
from cron_at_scale.worker.attempts import InlineCompleter

pytestmark = pytest.mark.django_db

def overdue_ids() -> set:
    return {o.id for o in overdue_jobs()[0]}


def claim() -> list:
    return Dispatcher(name="t", lookahead=0).claim()


def fail(job_id, attempt: int) -> None:
    run_query("finish_attempt", {"job_id": job_id, "attempt": attempt, "outcome": "failed", "status": "failed",
                                 "error": "boom", "traceback": ""}, fetch="count")


def succeed(job_id, attempt: int) -> None:
    InlineCompleter().complete(str(job_id), attempt)  # the worker's own statement (start_attempt)


@pytest.fixture
def signals():
    got: list[tuple[str, dict]] = []

    def on_overdue(sender, **kw):
        got.append(("overdue", kw))

    def on_recovered(sender, **kw):
        got.append(("recovered", kw))

    job_overdue.connect(on_overdue)
    job_recovered.connect(on_recovered)
    yield got
    job_overdue.disconnect(on_overdue)
    job_recovered.disconnect(on_recovered)


def test_a_job_is_not_overdue_before_its_first_occurrence_plus_grace():
    job = cron_at_scale.schedule(noop, cron="* * * * * *", grace=5)
    assert str(job.id) not in overdue_ids()  # first occurrence in the future
    due(job, 3)
    assert str(job.id) not in overdue_ids()  # due, within its grace
    due(job, 6)
    assert str(job.id) in overdue_ids()  # due 6 s ago and nobody fired it (no dispatcher, a held queue)


def test_a_failed_run_leaves_the_job_overdue_until_a_run_succeeds():
    job = cron_at_scale.schedule(noop, cron=YEARLY, grace=5)
    due(job, 10)
    (run,) = claim()
    row = Job.objects.get(id=job.id)
    assert row.due_since == run.fire_at  # the run fired, waited on
    assert str(job.id) in overdue_ids()  # fired 10 s late: late already
    fail(job.id, run.attempt)
    (listed,) = overdue_jobs()[0]
    assert listed.expected_at == run.fire_at and listed.late_seconds >= 10 and listed.grace == 5
    assert listed.last_success_at is None

    again = cron_at_scale.schedule(noop, cron=YEARLY, grace=5)
    due(again, 10)
    (run2,) = claim()
    succeed(again.id, run2.attempt)
    row = Job.objects.get(id=again.id)
    assert row.last_success_at is not None and row.last_success_occurrence == run2.fire_at
    assert row.due_since is None
    assert str(again.id) not in overdue_ids()
    assert str(job.id) in overdue_ids()


def test_a_success_for_an_earlier_occurrence_does_not_clear_a_later_wait():
    job = cron_at_scale.schedule(noop, cron=YEARLY, grace=5, overlap="allow")
    due(job, 10)
    (first,) = claim()
    sql("UPDATE cron_at_scale_job SET due_since = %s + interval '1 second' WHERE id = %s", [first.fire_at, job.id])
    succeed(job.id, first.attempt)
    row = Job.objects.get(id=job.id)
    assert row.due_since is not None and row.last_success_occurrence == first.fire_at


def test_a_paused_job_is_not_overdue_and_resume_gives_it_its_grace_again():
    job = cron_at_scale.schedule(noop, cron="* * * * * *", grace=5)
    due(job, 10)
    assert str(job.id) in overdue_ids()
    assert cron_at_scale.pause(job.id)
    assert str(job.id) not in overdue_ids()
    assert cron_at_scale.resume(job.id)
    assert str(job.id) not in overdue_ids()  # its grace counts from the resume
    sql("UPDATE cron_at_scale_job SET resumed_at = resumed_at - interval '6 seconds' WHERE id = %s", [job.id])
    assert str(job.id) in overdue_ids()


def test_occurrences_skipped_by_the_catch_up_policy_are_not_waited_on(signals):
    job = cron_at_scale.schedule(noop, cron="* * * * *", catchup="skip", grace=5)
    due(job, 3600)
    assert str(job.id) in overdue_ids()  # while nobody fires it
    assert OverdueWatch().check() == (1, 0)
    assert claim() == []  # catch-up 'skip': none fired, the schedule moves on
    assert str(job.id) not in overdue_ids()
    assert OverdueWatch().check() == (0, 1)
    assert signals[-1][0] == "recovered" and signals[-1][1]["reason"] == "not due"


def test_the_watch_sends_job_overdue_once_per_episode_and_job_recovered_when_it_clears(signals):
    job = cron_at_scale.schedule(noop, cron=YEARLY, grace=5, key="nightly-report")
    paused = cron_at_scale.schedule(noop, cron=YEARLY, grace=5)
    ended = cron_at_scale.schedule(noop, cron=YEARLY, grace=5)
    for j in (job, paused, ended):
        due(j, 10)
    d1, d2 = OverdueWatch(), OverdueWatch()  # two dispatchers
    assert d1.check() == (3, 0)
    assert d2.check() == (0, 0) and d1.check() == (0, 0)  # one signal per episode
    assert sorted(kw["job"].id for name, kw in signals) == sorted([job.id, paused.id, ended.id])
    event = next(kw for _, kw in signals if kw["job"].id == job.id)
    assert event["late_seconds"] >= 10 and event["grace"] == 5 and event["job"].key == "nightly-report"
    assert Job.objects.get(id=job.id).overdue_since is not None

    signals.clear()
    run = next(r for r in claim() if r.job_id == job.id)
    assert d2.check() == (0, 0)  # fired, not succeeded: still overdue, same episode
    succeed(job.id, run.attempt)
    assert cron_at_scale.pause(paused.id)
    assert cron_at_scale.cancel(ended.id)
    assert d2.check() == (0, 3) and d1.check() == (0, 0)
    reasons = {kw["job"].id: kw["reason"] for name, kw in signals if name == "recovered"}
    assert reasons == {job.id: "succeeded", paused.id: "paused", ended.id: "ended"}
    assert Job.objects.get(id=job.id).overdue_since is None


def test_a_receiver_that_raises_does_not_stop_the_watch():
    def broken(sender, **kw):
        raise RuntimeError("pager down")

    job_overdue.connect(broken)
    try:
        job = cron_at_scale.schedule(noop, cron=YEARLY, grace=5)
        due(job, 10)
        assert OverdueWatch().check() == (1, 0)
    finally:
        job_overdue.disconnect(broken)


def test_cron_status_metrics_and_admin_show_overdue_jobs():
    late = cron_at_scale.schedule(noop, cron=YEARLY, grace=5, key="late-job")
    fine = cron_at_scale.schedule(noop, cron=YEARLY, grace=5, key="fine-job")
    due(late, 10)
    due(fine, 10)
    runs = {r.job_id: r for r in claim()}
    succeed(fine.id, runs[fine.id].attempt)

    snap = snapshot()
    assert snap.overdue_jobs_count == 1 and [o["key"] for o in snap.overdue_jobs] == ["late-job"]
    out = StringIO()
    call_command("cron_status", "--json", stdout=out)
    report = json.loads(out.getvalue())
    assert report["overdue_jobs_count"] == 1 and report["overdue_jobs"][0]["id"] == str(late.id)
    out = StringIO()
    call_command("cron_status", stdout=out)
    assert "overdue recurring 1" in out.getvalue() and "late-job" in out.getvalue()

    text = metrics.render().decode()
    assert 'cron_job_overdue{key="late-job"} 1.0' in text
    assert 'cron_job_overdue{key="fine-job"} 0.0' in text
    assert 'cron_job_last_success_timestamp_seconds{key="fine-job"}' in text
    assert 'cron_job_last_success_timestamp_seconds{key="late-job"}' not in text  # never succeeded
    assert "cron_jobs_overdue 1.0" in text

    client = Client()
    client.force_login(User.objects.create_superuser("root", "r@example.com", "x"))
    r = client.get("/admin/cron_at_scale/job/?overdue=yes")
    assert r.status_code == 200 and [j.id for j in r.context["cl"].result_list] == [late.id]
    r = client.get("/admin/cron_at_scale/job/dashboard/")
    assert r.status_code == 200 and b"overdue recurring jobs" in r.content and b"late-job" in r.content


def test_the_overdue_scan_walks_the_recurring_jobs_partial_index():
    sql("INSERT INTO cron_at_scale_job (id, fire_at, task, payload, options) "
        "SELECT gen_random_uuid(), statement_timestamp() - make_interval(secs => g), 'demo.tasks.noop', '{}', '{}' "
        "FROM generate_series(1, 20000) AS g")
    sql("UPDATE cron_at_scale_job SET status = 'completed'")
    # and pending one-offs (what the claim's pending index holds): the scan must not read them either
    sql("INSERT INTO cron_at_scale_job (id, fire_at, task, payload, options) "
        "SELECT gen_random_uuid(), statement_timestamp() + make_interval(secs => g), 'demo.tasks.noop', '{}', '{}' "
        "FROM generate_series(1, 20000) AS g")
    cron_at_scale.schedule(noop, cron=YEARLY)
    sql("ANALYZE cron_at_scale_job")
    from cron_at_scale.sql import QUERIES

    for name in ("overdue_jobs", "overdue_open", "overdue_close", "recurring_health"):
        plan = "\n".join(r[0] for r in sql("EXPLAIN " + QUERIES[name], {"grace": 300.0, "limit": 100}))
        assert "Seq Scan on cron_at_scale_job" not in plan, (name, plan)
        if name != "recurring_health":  # that one may walk the live keys' index instead
            assert "cron_job_recurring_fire_at" in plan, (name, plan)


def test_grace_is_validated_and_kept_by_schedule_many():
    with pytest.raises(ValidationError, match="grace"):
        cron_at_scale.schedule(noop, grace=5)  # a one-off job is never overdue
    with pytest.raises(ValidationError, match="grace"):
        cron_at_scale.schedule(noop, cron=YEARLY, grace=-1)
    assert Job.objects.count() == 0
    job = cron_at_scale.schedule(noop, every=60, grace=90)
    assert Job.objects.get(id=job.id).grace == 90
    many = cron_at_scale.schedule_many([{"task": noop, "cron": YEARLY, "grace": 7}, {"task": noop}])
    assert [Job.objects.get(id=j.id).grace for j in many] == [7, None]


def test_settings_are_checked(settings):
    settings.CRON_AT_SCALE = {"OVERDUE_GRACE": 0, "HISTORY_PER_JOB": 0, "HISTORY_MAX_AGE": "1d"}
    found = " ".join(conf.problems())
    assert "'OVERDUE_GRACE'" in found and "'HISTORY_PER_JOB'" in found and "'HISTORY_MAX_AGE'" in found
    settings.CRON_AT_SCALE = {"HISTORY_PER_JOB": None, "HISTORY_MAX_AGE": 86400}
    assert conf.problems() == []
    assert history.settings() == (None, 86400.0)
