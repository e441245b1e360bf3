"""cron_schedule, cron_cancel, cron_status, cron_purge: in process (call_command) and as real processes."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from io import StringIO

import pytest
from demo.tasks import noop
from django.core.management import CommandError, call_command
from helpers import RecordingPublisher, sql

import cron_at_scale
from cron_at_scale.models import Job


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
])
def test_bad_input_is_a_message_not_a_traceback(args, message):
    p = manage(*args)
    assert p.returncode != 0
    assert message in p.stderr and "Traceback" not in p.stderr, p.stderr


@pytest.mark.parametrize("command", ["cron_schedule", "cron_cancel", "cron_status", "cron_purge"])
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
