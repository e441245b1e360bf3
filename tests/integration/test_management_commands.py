"""cron_schedule, cron_cancel, cron_status, cron_purge, cron_jobs, cron_pause, cron_resume: in process
(call_command) and as real processes."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from io import StringIO

import pytest
from demo.tasks import noop
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from helpers import YEARLY, RecordingPublisher, due, sql

import cron_at_scale
from cron_at_scale.dispatcher import Dispatcher
from cron_at_scale.models import Job, JobAttempt, Status


def run(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def manage(*args: str) -> subprocess.CompletedProcess:
    """``python manage.py <args>`` of the example project, against the test database."""
    from demo.runner import PROJECT_DIR, child_env, database_url
    from django.conf import settings
    from django.db import connection

    env = child_env(database_url(connection.settings_dict), settings.CELERY_BROKER_URL)
    return subprocess.run([sys.executable, "manage.py", *args], cwd=PROJECT_DIR, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.django_db
def test_cron_schedule_prints_the_id_of_a_validated_job():
    out, _ = run("cron_schedule", "demo.tasks.noop", "--args", "[1, 2]", "--kwargs", '{"a": 1}', "--countdown", "60",
                 "--queue", "emails", "--max-retries", "5")
    job = Job.objects.get(id=uuid.UUID(out.strip()))
    assert (job.payload, job.queue, job.max_retries) == ({"args": [1, 2], "kwargs": {"a": 1}}, "emails", 5)
    out, _ = run("cron_schedule", "demo.tasks.noop", "--cron", "0 9 * * MON-FRI", "--tz", "Europe/Paris", "--key", "k")
    again, _ = run("cron_schedule", "demo.tasks.noop", "--cron", "0 9 * * MON-FRI", "--tz", "Europe/Paris", "--key", "k")
    assert out == again and Job.objects.get(id=out.strip()).cron_expr == "0 9 * * MON-FRI"
    out, _ = run("cron_schedule", "demo.tasks.noop", "--every", "30")
    assert Job.objects.get(id=out.strip()).interval == 30
    out, _ = run("cron_schedule", "demo.tasks.noop", "--at", "2030-01-01T09:00:00+01:00")
    assert Job.objects.get(id=out.strip()).fire_at.isoformat() == "2030-01-01T08:00:00+00:00"
    for bad, field in ((["demo.tasks.nope"], "task"), (["demo.tasks.noop", "--cron", "* *"], "cron"),
                       (["demo.tasks.noop", "--cron", "* * * * *", "--tz", "Mars/Base"], "tz")):
        with pytest.raises(CommandError, match=field):
            run("cron_schedule", *bad)
    assert Job.objects.count() == 4


@pytest.mark.django_db
def test_cron_cancel():
    a, b = cron_at_scale.schedule(noop), cron_at_scale.schedule(noop)
    out, _ = run("cron_cancel", str(a.id), str(b.id))
    assert Job.objects.filter(status="cancelled").count() == 2 and out.count("cancelled") == 2
    c = cron_at_scale.schedule(noop)
    with pytest.raises(CommandError, match="2 of 3 jobs not cancelled"):
        run("cron_cancel", str(a.id), str(uuid.uuid4()), str(c.id))
    assert Job.objects.get(id=c.id).status == "cancelled"


@pytest.mark.django_db
def test_cron_cancel_by_key():
    a = cron_at_scale.schedule(noop, key="nightly-export")
    b = cron_at_scale.schedule(noop, cron="0 3 * * *", key="a-cron")
    c = cron_at_scale.schedule(noop)
    out, _ = run("cron_cancel", "nightly-export", "a-cron")
    assert out.count("cancelled") == 2
    assert dict(Job.objects.values_list("id", "status")) == {a.id: "cancelled", b.id: "cancelled", c.id: "pending"}
    # a key whose job is no longer live names nothing: the command stops before it cancels any
    with pytest.raises(CommandError, match=r"JOB_ID: not a job id.*'nightly-export', nor the key of a live job"):
        run("cron_cancel", str(c.id), "nightly-export")
    assert Job.objects.get(id=c.id).status == "pending"


@pytest.mark.django_db
@pytest.mark.parametrize("command", ["cron_cancel", "cron_requeue"])
def test_a_malformed_job_id_is_named_and_changes_nothing(command):
    a = cron_at_scale.schedule(noop)
    Job.objects.filter(id=a.id).update(status="failed")
    b = cron_at_scale.schedule(noop)
    ids = [str(a.id), "not-a-uuid", str(b.id)] if command == "cron_cancel" else ["not-a-uuid"]
    with pytest.raises(CommandError, match=r"JOB_ID.*not a job id.*'not-a-uuid'"):
        run(command, *ids)
    assert sorted(Job.objects.values_list("status", flat=True)) == ["failed", "pending"]


@pytest.mark.django_db
def test_cron_status_json_and_behind():
    cron_at_scale.schedule(noop, countdown=7200)
    out, _ = run("cron_status", "--json")
    figures = json.loads(out)
    assert figures["behind"] is False and figures["pending"]["next_day"] == 1 and figures["dlq"] == 0
    job = cron_at_scale.schedule(noop)
    sql("UPDATE cron_at_scale_job SET fire_at = statement_timestamp() - interval '30 seconds' WHERE id = %s", [job.id])
    figures = json.loads(run("cron_status", "--json", "--behind-after", "10")[0])
    assert figures["behind"] is True and figures["oldest_overdue_seconds"] >= 29
    assert figures["pending"]["overdue"] == 1
    assert figures["pending"]["late"] == 1 and figures["oldest_late_seconds"] == figures["oldest_overdue_seconds"]
    assert not json.loads(run("cron_status", "--json", "--behind-after", "60")[0])["behind"]
    with pytest.raises(SystemExit) as exit_:
        run("cron_status", "--fail-if-behind")
    assert exit_.value.code == 2
    assert "BEHIND" in run("cron_status", "--behind-after", "10")[0]


@pytest.mark.django_db
def test_cron_purge():
    done = cron_at_scale.schedule(noop)
    sql("UPDATE cron_at_scale_job SET status = 'completed', updated_at = now() - interval '8 days' WHERE id = %s",
        [done.id])
    cron_at_scale.schedule(noop)
    assert "would delete 1 jobs and 0 attempts" in run("cron_purge", "--older-than", "7d", "--dry-run")[0]
    assert Job.objects.count() == 2
    assert "deleted 0 jobs" in run("cron_purge", "--older-than", "9d")[0]
    assert "deleted 1 jobs" in run("cron_purge", "--older-than", "168h", "--batch-size", "10")[0]
    assert list(Job.objects.values_list("status", flat=True)) == ["pending"]


@pytest.mark.django_db(transaction=True)
def test_commands_as_processes():
    p = manage("cron_schedule", "demo.tasks.noop", "--countdown", "5")
    assert p.returncode == 0, p.stderr
    job_id = p.stdout.strip()
    assert Job.objects.get(id=job_id).status == "pending"
    p = manage("cron_status", "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["pending"]["next_minute"] == 1
    p = manage("cron_cancel", job_id)
    assert p.returncode == 0 and Job.objects.get(id=job_id).status == "cancelled"
    p = manage("cron_purge", "--older-than", "0", "--dry-run")
    assert p.returncode == 0 and "would delete 1 jobs" in p.stdout


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("args, message", [
    (["cron_schedule", "demo.tasks.nope"], "not a registered Celery task"),
    (["cron_schedule", "demo.tasks.noop", "--args", "{"], "not JSON"),
    (["cron_schedule", "demo.tasks.noop", "--at", "2030-01-01T09:00"], "give a UTC offset"),
    (["cron_cancel", "not-a-uuid"], "argument JOB_ID: not a job id (a UUID such as"),
    (["cron_requeue", "not-a-uuid"], "argument JOB_ID: not a job id (a UUID such as"),
    (["cron_status", "--behind-after", "soon"], "not a number of seconds"),
    (["cron_purge", "--older-than", "7x"], "not a duration"),
    (["cron_purge", "--older-than", "7d", "--batch-size", "0"], "must be 1 or more"),
    (["cron_jobs", "--limit", "0"], "must be 1 or more"),
    (["cron_jobs", "--status", "done"], "invalid choice: 'done'"),
    (["cron_jobs", "--late", "soon"], "not a duration"),
    (["cron_pause", "not-a-uuid"], "not a job id (a UUID such as"),
    (["cron_resume", "not-a-uuid"], "not a job id (a UUID such as"),
    (["cron_resume", "--all", "--missed", "some"], "invalid choice: 'some'"),
])
def test_bad_input_is_a_message_not_a_traceback(args, message):
    p = manage(*args)
    assert p.returncode != 0
    assert message in p.stderr and "Traceback" not in p.stderr, p.stderr


@pytest.mark.parametrize("command", ["cron_schedule", "cron_cancel", "cron_status", "cron_purge", "cron_jobs", "cron_pause",
                                     "cron_resume"])
def test_help(command):
    out = StringIO()
    with pytest.raises(SystemExit):
        call_command(command, "--help", stdout=out)


@pytest.mark.django_db
def test_firing_lag_of_a_job_scheduled_at_a_past_time_counts_from_its_creation(monkeypatch):
    """A job scheduled ``at=`` a time long past is due at once; it was not late for 26 years."""
    from datetime import datetime, timezone

    from cron_at_scale import worker
    from cron_at_scale.dispatcher import Dispatcher
    from cron_at_scale.ops import status

    past = cron_at_scale.schedule(noop, at=datetime(2000, 1, 1, tzinfo=timezone.utc))
    late = cron_at_scale.schedule(noop)
    sql("UPDATE cron_at_scale_job SET created_at = created_at - interval '40 seconds', "
        "fire_at = fire_at - interval '30 seconds' WHERE id = %s", [late.id])  # known 40 s ago, due 30 s ago
    claimed = Dispatcher(name="t", shards="all", publisher=RecordingPublisher()).claim()
    assert {c.job_id for c in claimed} == {past.id, late.id}
    for c in claimed:
        assert worker.AttemptWriter().start(str(c.job_id), c.attempt, "w")[0] == "running"
    lags = sorted(status.recent_lags())
    assert len(lags) == 2 and 0 <= lags[0] < 5 and 30 <= lags[1] < 40
    figures = json.loads(run("cron_status", "--json")[0])
    assert 30 <= figures["lag_seconds"]["max"] < 40


# -- cron_jobs, cron_pause, cron_resume ---------------------------------------------------------------

JOB_FIELDS = ["id", "key", "task", "queue", "status", "schedule_type", "cron_expr", "timezone", "interval_seconds",
              "fire_at", "attempts", "retries", "max_retries", "pause_note", "created_at", "updated_at", "schedule",
              "late_seconds"]  # docs/admin.md lists them: a script may rely on each


def listed(*args: str) -> list[dict]:
    return json.loads(run("cron_jobs", "--json", *args)[0])


def ids(*args: str) -> list[str]:
    return [j["id"] for j in listed(*args)]


@pytest.fixture
def jobs():
    """A one-off job 2 minutes late, one due in an hour, a failed one due an hour ago, a cron job with a key, an interval job on a named
    queue, a failed job, a paused cron job; each of its own task or queue where a filter tells them apart."""
    late = cron_at_scale.schedule(noop, key="invoice-1")
    sql("UPDATE cron_at_scale_job SET fire_at = statement_timestamp() - interval '2 minutes' WHERE id = %s", [late.id])
    later = cron_at_scale.schedule("demo.tasks.record", countdown=3600, key="invoice-2")
    nightly = cron_at_scale.schedule(noop, cron="0 3 * * *", tz="Europe/Paris", key="nightly")
    poll = cron_at_scale.schedule(noop, every=30, queue="emails")
    failed = cron_at_scale.schedule(noop)
    sql("UPDATE cron_at_scale_job SET status = 'failed', fire_at = statement_timestamp() - interval '1 hour' "
        "WHERE id = %s", [failed.id])  # past its fire_at, yet not late: it is not pending
    held = cron_at_scale.schedule(noop, cron=YEARLY, key="yearly")
    cron_at_scale.pause(held.id, "audit")
    return {name: str(job.id) for name, job in (("late", late), ("later", later), ("nightly", nightly),
                                                ("poll", poll), ("failed", failed), ("held", held))}


@pytest.mark.django_db
def test_cron_jobs_filters_each_select_their_jobs_in_fire_at_order(jobs):
    everything = ids()
    fire_ats = [j["fire_at"] for j in listed()]
    assert sorted(everything) == sorted(jobs.values()) and fire_ats == sorted(fire_ats)
    assert everything[:2] == [jobs["failed"], jobs["late"]] and ids("--reverse") == everything[::-1]
    assert ids("--status", "pending") == [i for i in everything if i not in (jobs["failed"], jobs["held"])]
    assert ids("--status", "failed") == [jobs["failed"]]
    assert ids("--status", "paused") == [jobs["held"]]
    assert ids("--status", "completed") == []
    assert ids("--task", "demo.tasks.record") == [jobs["later"]]
    assert ids("--queue", "emails") == [jobs["poll"]]
    assert jobs["poll"] not in ids("--queue", "") and len(ids("--queue", "")) == 5
    assert ids("--key", "invoice-1") == [jobs["late"]]
    assert ids("--key", "invoice") == []  # exact, unless it ends in *
    assert ids("--key", "invoice-*") == [jobs["late"], jobs["later"]]
    assert ids("--type", "once") == [jobs["failed"], jobs["late"], jobs["later"]]
    assert ids("--type", "cron") == [i for i in everything if i in (jobs["nightly"], jobs["held"])]
    assert ids("--schedule-type", "interval") == [jobs["poll"]]
    assert sorted(ids("--type", "recurring")) == sorted([jobs["nightly"], jobs["poll"], jobs["held"]])
    assert ids("--late") == [jobs["late"]]
    assert ids("--late", "1m") == [jobs["late"]] and ids("--late", "5m") == []
    assert ids("--task", "demo.tasks.noop", "--type", "once", "--status", "pending") == [jobs["late"]]
    assert ids("--limit", "2") == everything[:2]


@pytest.mark.django_db
def test_cron_jobs_json_fields(jobs):
    rows = {j["id"]: j for j in listed()}
    assert all(list(j) == JOB_FIELDS for j in rows.values())
    late, nightly, poll, held = rows[jobs["late"]], rows[jobs["nightly"]], rows[jobs["poll"]], rows[jobs["held"]]
    assert (late["schedule"], late["key"], late["queue"], late["status"]) == ("once", "invoice-1", "", "pending")
    assert 119 < late["late_seconds"] < 180
    assert all(rows[jobs[n]]["late_seconds"] is None for n in ("later", "nightly", "poll", "failed", "held"))
    assert (nightly["schedule"], nightly["cron_expr"], nightly["timezone"]) == \
        ("cron 0 3 * * * Europe/Paris", "0 3 * * *", "Europe/Paris")
    assert (poll["schedule"], poll["interval_seconds"], poll["queue"]) == ("every 30s", 30.0, "emails")
    assert (held["status"], held["pause_note"]) == ("paused", "audit")
    stored = Job.objects.get(id=jobs["late"])
    assert late["fire_at"] == stored.fire_at.isoformat() and late["fire_at"].endswith("+00:00")


@pytest.mark.django_db
def test_cron_jobs_table(jobs):
    out, _ = run("cron_jobs")
    head, *rows, last = out.splitlines()
    assert head.split() == ["ID", "KEY", "TASK", "QUEUE", "STATUS", "SCHEDULE", "FIRE_AT", "(UTC)", "LATE", "BY"]
    assert len(rows) == 6 and last == "6 jobs"
    first = rows[1].split()
    assert rows[0].split()[-1] == "-"  # failed an hour past its fire_at: not late, it is not pending
    assert first[:6] == [jobs["late"], "invoice-1", "demo.tasks.noop", "-", "pending", "once"]
    assert first[-1].startswith("2m")
    assert "every 30s" in out and "cron 0 3 * * * Europe/Paris" in out
    assert run("cron_jobs", "--limit", "4")[0].splitlines()[-1].startswith("4 jobs shown; more match")
    assert run("cron_jobs", "--status", "completed")[0].splitlines()[-1] == "no jobs match"


@pytest.mark.django_db
def test_cron_jobs_reads_one_bounded_page_and_counts_nothing(jobs):
    cron_at_scale.schedule_many([{"task": noop, "countdown": 60}] * 30)
    for args in ([], ["--late"], ["--key", "inv*"], ["--type", "recurring", "--status", "pending"]):
        with CaptureQueriesContext(connection) as queries:
            run("cron_jobs", "--limit", "5", *args)
        selects = [q["sql"] for q in queries.captured_queries]
        # unfiltered: one bounded range per status (keys only), merged in fire_at order (no (fire_at, id)
        # index), then the rows of the page by id; --late: the shards' bounded ranges of pending jobs
        # (one statement, keys only), then the rows by id
        merged = not args or args == ["--late"]
        assert len(selects) == (len(Status.values) + 1 if not args else 2 if merged else 1), selects
        ranges = selects[:-1] if merged else selects
        for query in selects:
            assert "COUNT(" not in query.upper() and '"payload"' not in query
        assert all("LIMIT 6" in query for query in ranges)


@pytest.mark.django_db
@pytest.mark.parametrize("args, message", [
    (["--late", "--status", "failed"], "--late lists pending jobs"),
    (["--key", "*"], "--key: give a key, or a prefix"),
])
def test_cron_jobs_refuses_filters_that_cannot_mean_anything(args, message):
    with pytest.raises(CommandError, match=message):
        run("cron_jobs", *args)


def claim_all() -> list:
    return Dispatcher(name="t", shards="all", lookahead=0, publisher=RecordingPublisher()).claim()


@pytest.mark.django_db
def test_cron_pause_then_resume_stops_and_restarts_firing():
    job = cron_at_scale.schedule(noop, cron=YEARLY, key="report", catchup="latest")
    due(job, 30)
    out, _ = run("cron_pause", "report", "--note", "db migration")
    assert f"{job.id} (report): paused" in out
    stored = Job.objects.get(id=job.id)
    assert (stored.status, stored.pause_note) == ("paused", "db migration")
    assert claim_all() == [] and JobAttempt.objects.count() == 0  # due, but held
    out, _ = run("cron_resume", str(job.id))
    assert f"{job.id} (report): resumed" in out and "its catchup policy (latest)" in out
    assert Job.objects.get(id=job.id).status == "pending"
    assert [c.job_id for c in claim_all()] == [job.id]  # the dispatcher fires it again


@pytest.mark.django_db
@pytest.mark.parametrize(("missed", "fired", "counted"), [("skip", 0, 3), ("latest", 1, 2), ("all", 3, 0)])
def test_cron_resume_missed_says_what_fires(missed, fired, counted):
    job = cron_at_scale.schedule(noop, every=60, overlap="allow", catchup_window=600)  # no minute boundary to race
    run("cron_pause", str(job.id))
    sql("UPDATE cron_at_scale_job SET fire_at = fire_at - interval '3 minutes', "
        "occurrence_at = occurrence_at - interval '3 minutes' WHERE id = %s", [job.id])
    out, _ = run("cron_resume", str(job.id), "--missed", missed)
    assert f"{fired} fired now, {counted} counted missed" in out
    assert JobAttempt.objects.filter(job_id=job.id).count() == fired
    assert Job.objects.get(id=job.id).status == "pending"


@pytest.mark.django_db
def test_cron_pause_refuses_unknown_and_one_off_jobs_before_it_pauses_any():
    a = cron_at_scale.schedule(noop, cron=YEARLY, key="a")
    once = cron_at_scale.schedule(noop, countdown=60, key="invoice-9")
    missing = str(uuid.uuid4())
    for refs, named in ((["a", missing], missing), (["a", "no-such-key"], "'no-such-key', nor the key of a job"),
                        (["a", "0190a0c2-3b5e-7c1d-8f00-12345678"], "not a job id (a UUID such as"),
                        (["a", "invoice-9"], f"one-off: {once.id} (invoice-9)")):
        with pytest.raises(CommandError, match="nothing changed") as e:
            run("cron_pause", *refs)
        assert named in str(e.value)
        assert Job.objects.get(id=a.id).status == "pending"
    with pytest.raises(CommandError, match="nothing changed"):
        run("cron_resume", "a", missing)
    with pytest.raises(CommandError, match="--note: must be a string of at most 2000 characters"):
        run("cron_pause", "a", "--note", "x" * 2001)
    assert Job.objects.get(id=a.id).status == "pending"


@pytest.mark.django_db
def test_cron_pause_and_resume_name_each_job_they_could_not_change():
    a = cron_at_scale.schedule(noop, cron=YEARLY, key="a")
    b = cron_at_scale.schedule(noop, every=60, key="b")
    run("cron_pause", "a")
    out, err = StringIO(), StringIO()
    with pytest.raises(CommandError, match="1 of 2 jobs not paused"):
        call_command("cron_pause", "a", str(b.id), stdout=out, stderr=err)
    assert f"{a.id} (a): already paused" in err.getvalue()
    assert f"{b.id} (b): paused" in out.getvalue()
    cron_at_scale.cancel(b.id)
    out, err = StringIO(), StringIO()
    with pytest.raises(CommandError, match="1 of 2 jobs not resumed"):
        call_command("cron_resume", "a", "b", stdout=out, stderr=err)
    assert f"{b.id} (b): not resumed, it is cancelled" in err.getvalue()
    assert Job.objects.get(id=a.id).status == "pending"


@pytest.mark.django_db
def test_bulk_pause_and_resume_need_yes():
    mine = [cron_at_scale.schedule(noop, cron=YEARLY), cron_at_scale.schedule(noop, every=60)]
    other = cron_at_scale.schedule("demo.tasks.record", cron=YEARLY)
    once = cron_at_scale.schedule(noop, countdown=60)
    out = StringIO()
    with pytest.raises(CommandError, match="2 pending recurring jobs match; add --yes"):
        call_command("cron_pause", "--task", "demo.tasks.noop", stdout=out)
    assert out.getvalue().count("would pause") == 2
    assert set(Job.objects.values_list("status", flat=True)) == {"pending"}
    with pytest.raises(CommandError, match="not both"):
        run("cron_pause", "--all", str(other.id))
    with pytest.raises(CommandError, match="give the JOB ids or keys"):
        run("cron_pause")
    run("cron_pause", "--task", "demo.tasks.noop", "--yes")
    assert {j.id: j.status for j in Job.objects.all()} == \
        {mine[0].id: "paused", mine[1].id: "paused", other.id: "pending", once.id: "pending"}
    run("cron_pause", "--all", "--yes")
    assert Job.objects.get(id=other.id).status == "paused"
    with pytest.raises(CommandError, match="3 paused recurring jobs match"):
        run("cron_resume", "--all")
    run("cron_resume", "--all", "--yes", "--missed", "skip")
    assert set(Job.objects.values_list("status", flat=True)) == {"pending"}


@pytest.mark.django_db(transaction=True)
def test_cron_jobs_pause_and_resume_as_processes():
    job = cron_at_scale.schedule(noop, cron=YEARLY, key="nightly")
    p = manage("cron_jobs", "--json", "--key", "nightly")
    assert p.returncode == 0, p.stderr
    assert [j["id"] for j in json.loads(p.stdout)] == [str(job.id)]
    p = manage("cron_pause", "nightly", "--note", "by a process")
    assert p.returncode == 0, p.stderr
    assert (Job.objects.get(id=job.id).status, Job.objects.get(id=job.id).pause_note) == ("paused", "by a process")
    p = manage("cron_pause", "nightly")
    assert p.returncode == 1 and "already paused" in p.stderr
    p = manage("cron_resume", "nightly", "--missed", "skip")
    assert p.returncode == 0, p.stderr
    assert Job.objects.get(id=job.id).status == "pending"
    p = manage("cron_resume", str(uuid.uuid4()))
    assert p.returncode == 1 and "no job has this id or key" in p.stderr
