"""The scheduling API against PostgreSQL: what it writes, and what it refuses."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest
from demo.tasks import noop, record
from django.db import transaction
from helpers import sql

import cron_at_scale
from cron_at_scale import ValidationError
from cron_at_scale.models import Job

pytestmark = pytest.mark.django_db


def db_now():
    return sql("SELECT statement_timestamp()")[0][0]


def test_schedule_now_uses_the_database_clock():
    before = db_now()
    job = cron_at_scale.schedule("demo.tasks.noop", args=[1, "two"], kwargs={"x": None})
    row = Job.objects.get(id=job.id)
    assert row.status == "pending" and row.schedule_type == "once"
    assert before <= row.fire_at <= db_now()
    assert row.payload == {"args": [1, "two"], "kwargs": {"x": None}}
    assert row.task == "demo.tasks.noop"


def test_schedule_at_countdown_and_task_method():
    at = datetime(2031, 5, 6, 7, 8, 9, tzinfo=timezone(timedelta(hours=2)))
    job = cron_at_scale.schedule(noop, at=at)
    assert Job.objects.get(id=job.id).fire_at == at
    before = db_now()
    job = record.schedule(countdown=90, queue="celery", max_retries=5, priority=3)
    row = Job.objects.get(id=job.id)
    assert before + timedelta(seconds=90) <= row.fire_at <= db_now() + timedelta(seconds=90)
    assert (row.queue, row.max_retries, row.options) == ("celery", 5, {"priority": 3})


def test_schedule_cron_5_and_6_fields_in_a_time_zone():
    job = cron_at_scale.schedule(noop, cron="30 8 * * 1-5", tz="Asia/Kolkata")
    row = Job.objects.get(id=job.id)
    assert row.schedule_type == "cron" and row.cron_expr == "30 8 * * 1-5" and row.timezone == "Asia/Kolkata"
    local = row.fire_at.astimezone(__import__("zoneinfo").ZoneInfo("Asia/Kolkata"))
    assert (local.hour, local.minute) == (8, 30) and local.weekday() < 5
    job = cron_at_scale.schedule(noop, cron="*/5 * * * * *")
    fire_at = Job.objects.get(id=job.id).fire_at
    assert fire_at.second % 5 == 0 and fire_at > db_now() - timedelta(seconds=1)


def test_key_makes_scheduling_idempotent_among_live_jobs():
    first = cron_at_scale.schedule(noop, key="invoice-42", countdown=60)
    again = cron_at_scale.schedule(noop, key="invoice-42", countdown=5)
    assert again.id == first.id
    assert Job.objects.filter(key="invoice-42").count() == 1
    Job.objects.filter(id=first.id).update(status="completed")
    later = cron_at_scale.schedule(noop, key="invoice-42")
    assert later.id != first.id  # the key is unique among live jobs only


def test_schedule_rolls_back_with_the_callers_transaction():
    with pytest.raises(RuntimeError), transaction.atomic():
        cron_at_scale.schedule(noop, key="rolled-back")
        cron_at_scale.schedule(noop)
        raise RuntimeError("caller fails")
    assert Job.objects.count() == 0
    with transaction.atomic():
        job = cron_at_scale.schedule(noop, key="kept")
    assert Job.objects.filter(id=job.id).exists()


def test_key_conflict_inside_a_transaction_keeps_the_transaction_usable():
    with transaction.atomic():
        a = cron_at_scale.schedule(noop, key="k")
        b = cron_at_scale.schedule(noop, key="k")
        c = cron_at_scale.schedule(noop)
    assert a.id == b.id and Job.objects.filter(id=c.id).exists()


def test_schedule_many_bulk_and_keys():
    jobs = cron_at_scale.schedule_many(
        [{"task": "demo.tasks.noop", "args": [i]} for i in range(2500)]
        + [{"task": noop, "key": "dup"}, {"task": noop, "key": "dup"}, {"task": noop, "cron": "@hourly"}]
    )
    assert len(jobs) == 2503
    assert Job.objects.count() == 2502
    assert jobs[2500].id == jobs[2501].id
    assert Job.objects.get(id=jobs[2502].id).schedule_type == "cron"
    again = cron_at_scale.schedule_many([{"task": noop, "key": "dup"}])
    assert again[0].id == jobs[2500].id and Job.objects.count() == 2502


def test_cancel_pending_job_once():
    job = cron_at_scale.schedule(noop, countdown=60)
    assert cron_at_scale.cancel(job.id) is True
    assert cron_at_scale.cancel(str(job.id)) is False
    row = Job.objects.get(id=job.id)
    assert row.status == "cancelled" and row.cancel_requested
    assert cron_at_scale.cancel(uuid.uuid4()) is False


BAD_INPUT = [
    (dict(cron="61 * * * *"), "cron"),
    (dict(cron="0 0 30 2 *"), "cron"),
    (dict(cron="* * * *"), "cron"),
    (dict(cron="@reboot"), "cron"),
    (dict(cron="0 * * * *", tz="Mars/Olympus_Mons"), "tz"),
    (dict(tz="Not/AZone"), "tz"),
    (dict(at=datetime(2030, 1, 1, 12, 0)), "at"),
    (dict(at="2030-01-01T00:00:00Z"), "at"),
    (dict(at=datetime(2030, 1, 1, tzinfo=timezone.utc), cron="* * * * *"), "cron"),
    (dict(at=datetime(2030, 1, 1, tzinfo=timezone.utc), countdown=5), "countdown"),
    (dict(countdown=-1), "countdown"),
    (dict(countdown=float("nan")), "countdown"),
    (dict(countdown="10"), "countdown"),
    (dict(args=[object()]), "args"),
    (dict(args=[{1, 2}]), "args"),
    (dict(args="abc"), "args"),
    (dict(kwargs={"when": datetime.now(timezone.utc)}), "kwargs"),
    (dict(kwargs={"x": float("inf")}), "kwargs"),
    (dict(kwargs={"x": "nul\x00byte"}), "kwargs"),
    (dict(kwargs={1: "non-string key"}), "kwargs"),
    (dict(kwargs=["not", "a", "dict"]), "kwargs"),
    (dict(kwargs={"blob": "x" * 100_000}), "kwargs"),
    (dict(max_retries=-1), "max_retries"),
    (dict(max_retries=True), "max_retries"),
    (dict(key=""), "key"),
    (dict(key="k" * 256), "key"),
    (dict(queue=""), "queue"),
    (dict(priority="high"), "priority"),
    (dict(colour="blue"), "colour"),
]


@pytest.mark.parametrize(("spec", "field"), BAD_INPUT, ids=[f"{f}-{i}" for i, (_, f) in enumerate(BAD_INPUT)])
def test_bad_input_names_the_field_and_writes_nothing(spec, field):
    with pytest.raises(ValidationError) as err:
        cron_at_scale.schedule(noop, **spec)
    assert err.value.field == field
    assert field in str(err.value)
    assert field in err.value.message_dict
    assert Job.objects.count() == 0


@pytest.mark.parametrize("task", ["no.such.task", "", None, 42, "x" * 300])
def test_unknown_or_malformed_task_names_are_refused(task):
    with pytest.raises(ValidationError) as err:
        cron_at_scale.schedule(task)
    assert err.value.field == "task"
    assert Job.objects.count() == 0


def test_schedule_many_is_all_or_nothing():
    with pytest.raises(ValidationError) as err:
        cron_at_scale.schedule_many([{"task": noop}, {"task": noop, "cron": "bad"}, {"task": noop}])
    assert err.value.field == "[1].cron"
    assert Job.objects.count() == 0


def test_validation_error_is_djangos_and_a_value_error():
    from django.core.exceptions import ValidationError as DjangoValidationError

    with pytest.raises(DjangoValidationError):
        cron_at_scale.schedule(noop, cron="nope")
    with pytest.raises(ValueError):
        cron_at_scale.schedule(noop, cron="nope")


def test_cancel_refuses_a_malformed_id():
    with pytest.raises(ValidationError) as err:
        cron_at_scale.cancel("not-a-uuid")
    assert err.value.field == "job_id"


@pytest.mark.parametrize(("setting", "key"), [
    ({"BATCH_SIZE": -1}, "BATCH_SIZE"),
    ({"BATCH_SIZE": 0}, "BATCH_SIZE"),
    ({"POLL_INTERVAL": "fast"}, "POLL_INTERVAL"),
    ({"BATCH_SIZ": 10}, "BATCH_SIZ"),
    ({"RETRY_ALL_EXCEPTIONS": "yes"}, "RETRY_ALL_EXCEPTIONS"),
    ({"RETENTION": "7d"}, "RETENTION"),
    ({"CELERY_APP": 5}, "CELERY_APP"),
])
def test_bad_settings_are_named_by_the_check_and_refused_by_the_dispatcher(settings, setting, key):
    from django.core.checks import run_checks
    from django.core.exceptions import ImproperlyConfigured

    from cron_at_scale.dispatcher import Dispatcher

    settings.CRON_AT_SCALE = setting
    errors = [e for e in run_checks() if e.id == "cron_at_scale.E001"]
    assert errors and key in errors[0].msg
    with pytest.raises(ImproperlyConfigured, match=key):
        Dispatcher()


def test_dispatcher_command_refuses_bad_numbers():
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="--batch-size: must be greater than 0"):
        call_command("cron_dispatcher", "--batch-size", "-1")
    with pytest.raises(CommandError, match="--poll-interval: not a number"):
        call_command("cron_dispatcher", "--poll-interval", "fast")


def test_schedule_many_copy_round_trips_awkward_payloads_and_rolls_back():
    awkward = ['a,b', 'say "hi"', "line\nbreak", "back\\slash", "tab\there", "", "é€😀", "\\N", "NULL"]
    jobs = cron_at_scale.schedule_many(
        [{"task": noop, "args": [s], "kwargs": {s or "k": s}, "queue": "q,\"1\""} for s in awkward]
        + [{"task": noop, "cron": "*/5 * * * *", "tz": "Europe/Paris", "jitter": 30}]
    )
    for job, s in zip(jobs, awkward):
        row = Job.objects.get(id=job.id)
        assert row.payload == {"args": [s], "kwargs": {s or "k": s}}
        assert row.queue == 'q,"1"' and row.interval is None and row.occurrence_at is None
    cron_row = Job.objects.get(id=jobs[-1].id)
    assert cron_row.occurrence_at is not None and cron_row.jitter == 30 and cron_row.timezone == "Europe/Paris"
    with pytest.raises(RuntimeError), transaction.atomic():
        cron_at_scale.schedule_many([{"task": noop} for _ in range(100)])
        raise RuntimeError
    assert Job.objects.count() == len(jobs)


def test_a_zoneinfo_is_taken_by_its_name():
    from zoneinfo import ZoneInfo

    job = cron_at_scale.schedule(noop, cron="0 9 * * *", tz=ZoneInfo("Europe/Paris"))
    assert Job.objects.get(id=job.id).timezone == "Europe/Paris"
