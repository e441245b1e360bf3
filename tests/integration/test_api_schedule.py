"""The scheduling API against PostgreSQL: what it writes, and what it refuses."""

from __future__ import annotations

import threading
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from demo.tasks import noop, record
from django.db import transaction
from helpers import clear_of_a_minute_mark, sql

import cron_at_scale
from cron_at_scale import KeyConflict, ValidationError
from cron_at_scale import sql as db
from cron_at_scale.cron import next_fire_time
from cron_at_scale.dispatcher import Dispatcher
from cron_at_scale.dispatcher.advance import advance
from cron_at_scale.models import Job, JobAttempt

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
    (dict(retry_backoff="fast"), "retry_backoff"),
    (dict(retry_backoff=-1), "retry_backoff"),
    (dict(retry_backoff=None), "retry_backoff"),
    (dict(retry_backoff_max=True), "retry_backoff_max"),
    (dict(autoretry_for=ValueError), "autoretry_for"),
    (dict(autoretry_for="builtins.ValueError"), "autoretry_for"),
    (dict(autoretry_for=["ValueError"]), "autoretry_for"),
    (dict(autoretry_for=["no_such_module.Error"]), "autoretry_for"),
    (dict(autoretry_for=["builtins.len"]), "autoretry_for"),
    (dict(dont_autoretry_for=[42]), "dont_autoretry_for"),
    (dict(retry_kwargs={"eta": "2030-01-01"}), "retry_kwargs"),
    (dict(retry_kwargs={"max_retries": -1}), "retry_kwargs"),
    (dict(retry_kwargs={"countdown": "soon"}), "retry_kwargs"),
    (dict(retry_kwargs=[("countdown", 1)]), "retry_kwargs"),
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


@pytest.mark.parametrize("value", [True, False, 0, 2, 1.5])
def test_retry_backoff_takes_celerys_values_true_false_or_a_factor(value):
    job = cron_at_scale.schedule(noop, retry_backoff=value)
    assert Job.objects.get(id=job.id).options == {"retry_backoff": value}
    many = cron_at_scale.schedule_many([{"task": noop, "retry_backoff": value}])
    assert Job.objects.get(id=many[0].id).options == {"retry_backoff": value}


def test_celerys_autoretry_options_on_a_job_are_stored_as_import_paths():
    """autoretry_for / dont_autoretry_for take classes (as on a Celery task) or import paths, and are
    stored as import paths (a job is JSON); retry_kwargs takes max_retries and countdown."""
    from json import JSONDecodeError

    spec = dict(autoretry_for=(ConnectionError, "json.JSONDecodeError"), dont_autoretry_for=[JSONDecodeError],
                retry_kwargs={"max_retries": 5, "countdown": 2})
    stored = {"autoretry_for": ["builtins.ConnectionError", "json.JSONDecodeError"],  # a path given is kept as given
              "dont_autoretry_for": ["json.decoder.JSONDecodeError"],  # a class: where it is defined
              "retry_kwargs": {"max_retries": 5, "countdown": 2.0}}
    job = cron_at_scale.schedule(noop, **spec)
    assert Job.objects.get(id=job.id).options == stored
    many = cron_at_scale.schedule_many([{"task": noop, **spec}])
    assert Job.objects.get(id=many[0].id).options == stored
    changed = cron_at_scale.reschedule(job.id, autoretry_for=None, retry_kwargs={"countdown": 1})
    assert changed.options == {"dont_autoretry_for": ["json.decoder.JSONDecodeError"], "retry_kwargs": {"countdown": 1.0}}


def test_at_and_countdown_share_one_horizon_and_one_message():
    from cron_at_scale.api.validation import MAX_COUNTDOWN

    far = datetime(9999, 12, 31, tzinfo=timezone.utc)
    messages = {}
    for field, spec in (("at", dict(at=far)), ("countdown", dict(countdown=MAX_COUNTDOWN + 1)),
                        ("at", dict(at=far, every=60))):
        with pytest.raises(ValidationError) as err:
            cron_at_scale.schedule(noop, **spec)
        assert err.value.field == field
        messages[field] = str(err.value).split(", got")[0].removeprefix(f"{field}: ")
    assert messages["at"] == messages["countdown"] == f"must be at most {MAX_COUNTDOWN} seconds (100 years) ahead"
    with pytest.raises(ValidationError) as err:
        cron_at_scale.schedule_many([{"task": noop}, {"task": noop, "at": far}])
    assert err.value.field == "[1].at"
    assert Job.objects.count() == 0
    near = datetime.now(timezone.utc) + timedelta(seconds=MAX_COUNTDOWN - 86400)
    assert cron_at_scale.schedule(noop, at=near).fire_at == near
    assert cron_at_scale.schedule(noop, countdown=MAX_COUNTDOWN).fire_at > near


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


# Changing a job in place on PostgreSQL: reschedule(), schedule(key, update=), resume(missed=).


def shift(job, seconds: float):
    """Move a job's pending occurrence ``seconds`` into the past (as if the dispatchers were down)."""
    sql("UPDATE cron_at_scale_job SET fire_at = fire_at - make_interval(secs => %s), "
        "occurrence_at = occurrence_at - make_interval(secs => %s) WHERE id = %s", [seconds, seconds, job.id])


def start(job_id, attempt: int):
    return db.run("start_attempt", {"job_id": str(job_id), "attempt": attempt, "worker": "w", "token": None, "fire_at": None,
                                    "lease": 60.0, "done_job_ids": [], "done_attempts": []}, fetch="one")


def finish(job_id, attempt: int) -> int:
    return db.run("finish_attempt", {"job_id": job_id, "attempt": attempt, "outcome": "succeeded",
                                     "status": "completed", "error": "", "traceback": ""}, fetch="count")


def attempts(job):
    return list(JobAttempt.objects.filter(job_id=job.id).order_by("attempt").values_list("attempt", "outcome"))


def state(job_id):
    return Job.objects.filter(id=job_id).values().get()


def test_a_new_cron_takes_effect_from_its_next_occurrence_on_the_same_row():
    job = cron_at_scale.schedule(noop, cron="0 4 * * *", key="report")
    before = db_now()
    changed = cron_at_scale.reschedule("report", cron="15 5 * * *", tz="Europe/Paris")
    assert changed.id == job.id and (changed.cron_expr, changed.timezone) == ("15 5 * * *", "Europe/Paris")
    assert changed.fire_at == changed.occurrence_at == next_fire_time("15 5 * * *", "Europe/Paris", before)
    assert Job.objects.filter(key="report").count() == 1


def test_changing_only_arguments_queue_or_options_keeps_fire_at():
    job = cron_at_scale.schedule(noop, cron="0 4 * * *", args=[1], priority=1)
    changed = cron_at_scale.reschedule(job, args=[2], kwargs={"a": 1}, queue="reports", priority=None,
                                       retry_backoff=5, catchup="all")
    assert (changed.fire_at, changed.occurrence_at) == (job.fire_at, job.occurrence_at)
    assert changed.payload == {"args": [2], "kwargs": {"a": 1}}
    assert (changed.queue, changed.options, changed.catchup) == ("reports", {"retry_backoff": 5}, "all")


def test_an_interval_becomes_a_cron_job_and_back():
    job = cron_at_scale.schedule(noop, every=60)
    before = db_now()
    as_cron = cron_at_scale.reschedule(str(job.id), cron="*/5 * * * *")
    assert (as_cron.schedule_type, as_cron.interval) == ("cron", None)
    assert as_cron.fire_at == next_fire_time("*/5 * * * *", "UTC", before)
    as_interval = cron_at_scale.reschedule(job.id, every=timedelta(seconds=30))
    assert (as_interval.schedule_type, as_interval.cron_expr, as_interval.interval) == ("interval", "", 30.0)
    assert before + timedelta(seconds=30) <= as_interval.fire_at <= db_now() + timedelta(seconds=30)


def test_an_interval_restarts_at_a_given_first_occurrence_and_the_task_can_change():
    job = cron_at_scale.schedule(noop, every=60)
    start_at = db_now() + timedelta(hours=2)
    changed = cron_at_scale.reschedule(job, every=10, at=start_at, task="demo.tasks.record")
    assert (changed.fire_at, changed.occurrence_at, changed.interval) == (start_at, start_at, 10.0)
    assert changed.task == "demo.tasks.record"


@pytest.mark.parametrize(("changes", "field"), [
    (dict(cron="61 * * * *"), "cron"),
    (dict(cron="0 4 * * *", every=5), "every"),
    (dict(tz="Mars/Olympus"), "tz"),
    (dict(every=-1), "every"),
    (dict(args="not a list"), "args"),
    (dict(catchup="sometimes"), "catchup"),
    (dict(priority=999), "priority"),
    (dict(key="other"), "key"),
    (dict(colour="blue"), "colour"),
    (dict(countdown=5), "countdown"),
    (dict(task="no.such.task"), "task"),
])
def test_bad_input_names_the_field_and_changes_nothing(changes, field):
    job = cron_at_scale.schedule(noop, cron="0 4 * * *", key="k")
    Dispatcher(lookahead=0).claim()  # nothing due: the row only
    before = state(job.id)
    with pytest.raises(ValidationError) as err:
        cron_at_scale.reschedule(job.id, **changes)
    assert err.value.field == field
    assert state(job.id) == before


def test_a_missing_or_finished_job_is_refused():
    with pytest.raises(ValidationError) as err:
        cron_at_scale.reschedule("no-such-key", cron="0 4 * * *")
    assert err.value.field == "job_or_key"
    job = cron_at_scale.schedule(noop, cron="0 4 * * *")
    cron_at_scale.cancel(job.id)
    with pytest.raises(ValidationError, match="cancelled") as err:
        cron_at_scale.reschedule(job.id, cron="0 5 * * *")
    assert err.value.field == "job"
    once = cron_at_scale.schedule(noop, countdown=60)
    with pytest.raises(ValidationError, match="cannot become a recurring") as err:
        cron_at_scale.reschedule(once, cron="0 5 * * *")
    assert err.value.field == "cron"


def test_a_one_off_moves_while_pending_and_is_refused_once_claimed():
    job = cron_at_scale.schedule(noop, countdown=3600, args=[1])
    before = db_now()
    moved = cron_at_scale.reschedule(job, countdown=60, args=[2])
    assert before + timedelta(seconds=60) <= moved.fire_at <= db_now() + timedelta(seconds=60)
    assert cron_at_scale.reschedule(job, args=[3]).fire_at == moved.fire_at  # arguments only: fire_at kept
    cron_at_scale.reschedule(job, countdown=0)
    assert len(Dispatcher(lookahead=0).claim()) == 1
    with pytest.raises(ValidationError, match="in progress"):
        cron_at_scale.reschedule(job, countdown=60)
    assert state(job.id)["status"] == "in_progress" and attempts(job) == [(1, "dispatched")]


def test_runs_claimed_ahead_of_their_time_do_not_run_a_started_one_finishes():
    job = cron_at_scale.schedule(noop, every=1, overlap="allow")  # claimed ahead while one runs
    shift(job, 1)
    [due] = Dispatcher(lookahead=0).claim()  # due now
    assert start(job.id, due.attempt) is not None  # it runs
    [ahead] = Dispatcher(lookahead=1.0).claim()  # the next occurrence, held by the dispatcher for its time
    assert ahead.fire_at > db_now()
    before = db_now()
    changed = cron_at_scale.reschedule(job, every=2)
    assert before + timedelta(seconds=2) <= changed.fire_at <= db_now() + timedelta(seconds=2)
    assert attempts(job) == [(1, "running"), (2, "skipped")]
    assert JobAttempt.objects.get(job_id=job.id, attempt=2).error == "not run: the job was rescheduled"
    assert start(job.id, ahead.attempt) is None  # its message, published at its time, is not run
    assert finish(job.id, due.attempt) == 0  # the running one ends under its own number (a recurring job's row
    assert attempts(job) == [(1, "succeeded"), (2, "skipped")]  # is not changed by its end)
    assert changed.attempts == 2 and changed.missed_occurrences == 0


def test_an_occurrence_of_the_old_schedule_due_before_the_change_still_fires():
    clear_of_a_minute_mark()  # no new occurrence falls due between the change and the claim below
    job = cron_at_scale.schedule(noop, cron="* * * * *")
    due_at = state(job.id)["occurrence_at"]
    shift(job, 60)  # due a few seconds before the change; no dispatcher claimed it yet
    before = db_now()
    changed = cron_at_scale.reschedule(job, cron="*/10 * * * *")
    after = db_now()
    fired = JobAttempt.objects.get(job_id=job.id)
    assert (fired.attempt, fired.outcome, fired.scheduled_at) == (1, "dispatched", due_at - timedelta(seconds=60))
    # the new schedule's next occurrence after the change (a ten-minute mark may have just passed)
    assert next_fire_time("*/10 * * * *", "UTC", before) <= changed.occurrence_at \
        <= next_fire_time("*/10 * * * *", "UTC", after)
    assert changed.missed_occurrences == 0
    assert Dispatcher(lookahead=0).claim() == []  # nothing more until the new schedule's next occurrence


def test_a_buffered_occurrence_stays_and_fires_when_the_running_one_ends():
    job = cron_at_scale.schedule(noop, cron="*/10 * * * * *", overlap="buffer_one")
    shift(job, 10)
    [run] = Dispatcher(lookahead=0).claim()
    shift(job, 10)
    assert Dispatcher(lookahead=0).claim() == []
    buffered = state(job.id)["buffered_at"]
    assert buffered is not None
    changed = cron_at_scale.reschedule(job, cron="0 4 * * *")
    assert changed.buffered_at == buffered and changed.fire_at > db_now()
    finish(job.id, run.attempt)  # the running one ends: the buffered occurrence is due now
    [again] = Dispatcher(lookahead=0).claim()
    assert again.occurrence == buffered
    row = state(job.id)
    assert row["buffered_at"] is None and row["occurrence_at"] == changed.occurrence_at  # the new schedule's


def test_a_paused_job_stays_paused_and_counts_what_its_old_schedule_missed():
    clear_of_a_minute_mark()
    job = cron_at_scale.schedule(noop, cron="* * * * *")
    cron_at_scale.pause(job.id, "maintenance")
    shift(job, 3 * 60)
    changed = cron_at_scale.reschedule(job, cron="0 4 * * *")
    assert (changed.status, changed.pause_note, changed.missed_occurrences) == ("paused", "maintenance", 3)
    assert changed.fire_at == next_fire_time("0 4 * * *", "UTC", db_now())


def test_schedule_with_a_held_key_and_another_cron_raises_naming_cron_expr():
    job = cron_at_scale.schedule(noop, cron="0 4 * * *", key="nightly")
    assert cron_at_scale.schedule(noop, cron="0 4 * * *", key="nightly").id == job.id  # identical: idempotent
    with pytest.raises(KeyConflict) as err:
        cron_at_scale.schedule(noop, cron="15 5 * * *", key="nightly", catchup="all")
    assert err.value.field == "cron_expr" and err.value.fields == ["cron_expr", "catchup"]
    assert "cron_expr ('0 4 * * *' there, '15 5 * * *' here)" in str(err.value) and "update=True" in str(err.value)
    assert isinstance(err.value, ValidationError) and err.value.job.id == job.id
    assert state(job.id)["cron_expr"] == "0 4 * * *"

    before = db_now()
    changed = cron_at_scale.schedule(noop, cron="15 5 * * *", key="nightly", catchup="all", update=True)
    assert changed.id == job.id and (changed.cron_expr, changed.catchup) == ("15 5 * * *", "all")
    assert changed.fire_at == next_fire_time("15 5 * * *", "UTC", before)
    assert cron_at_scale.schedule(noop, cron="15 5 * * *", key="nightly", update=True).catchup == "latest"
    with pytest.raises(KeyConflict) as err:
        cron_at_scale.schedule(noop, every=60, key="nightly")
    assert err.value.fields == ["schedule_type", "cron_expr", "interval"]


def test_schedule_update_of_a_one_off_moves_it_and_leaves_a_claimed_one_alone():
    job = cron_at_scale.schedule(noop, countdown=3600, key="invoice")
    moved = cron_at_scale.schedule(noop, countdown=0, key="invoice", args=[7], update=True)
    assert moved.id == job.id and moved.payload["args"] == [7] and moved.fire_at <= db_now()
    Dispatcher(lookahead=0).claim()
    assert cron_at_scale.schedule(noop, countdown=60, key="invoice", update=True).status == "in_progress"


@pytest.mark.parametrize(("missed", "fired", "counted"), [("skip", 0, 5), ("latest", 1, 4), ("all", 5, 0)])
def test_resume_with_a_choice_fires_what_it_says(missed, fired, counted):
    clear_of_a_minute_mark()
    job = cron_at_scale.schedule(noop, cron="* * * * *", overlap="allow", catchup_window=600)
    cron_at_scale.pause(job.id)
    first = state(job.id)["occurrence_at"]
    shift(job, 5 * 60)  # five occurrences fell due while paused
    assert cron_at_scale.resume(job.id, missed=missed)
    row = state(job.id)
    runs = JobAttempt.objects.filter(job_id=job.id, outcome="dispatched").order_by("attempt")
    assert runs.count() == fired and row["missed_occurrences"] == counted
    if missed == "latest":
        assert runs[0].scheduled_at == first - timedelta(minutes=1)
    assert (row["status"], row["occurrence_at"]) == ("pending", first)
    assert Dispatcher(lookahead=0).claim() == []  # nothing else is due
    assert not cron_at_scale.resume(job.id, missed=missed)  # not paused any more


def test_resume_choices_are_bounded_by_the_catchup_window():
    clear_of_a_minute_mark()
    job = cron_at_scale.schedule(noop, cron="* * * * *", overlap="allow", catchup_window=150)
    cron_at_scale.pause(job.id)
    first = state(job.id)["occurrence_at"]
    shift(job, 5 * 60)
    def within(now):  # occurrences of the last 150 s at database time ``now``
        return sum(1 for k in range(1, 6) if first - timedelta(minutes=k) >= now - timedelta(seconds=150))

    before = db_now()
    assert cron_at_scale.resume(job.id, missed="all")
    after = db_now()
    fired = JobAttempt.objects.filter(job_id=job.id).count()
    # resume() reads the window on the database clock between the two readings: an occurrence
    # on the window's edge may fall either side
    assert fired in (2, 3) and within(after) <= fired <= within(before)
    assert state(job.id)["missed_occurrences"] == 5 - fired


def test_resume_without_a_choice_follows_the_jobs_policy_at_the_next_claim():
    clear_of_a_minute_mark()
    job = cron_at_scale.schedule(noop, cron="* * * * *", catchup="latest", catchup_window=600)
    cron_at_scale.pause(job.id)
    shift(job, 5 * 60)
    assert cron_at_scale.resume(job.id)
    assert JobAttempt.objects.count() == 0  # nothing fired by resume itself
    assert len(Dispatcher(lookahead=0).claim()) == 1 and state(job.id)["missed_occurrences"] == 4


def test_resume_refuses_an_unknown_choice_and_changes_nothing():
    job = cron_at_scale.schedule(noop, cron="* * * * *")
    cron_at_scale.pause(job.id)
    before = state(job.id)
    with pytest.raises(ValidationError) as err:
        cron_at_scale.resume(job.id, missed="some")
    assert err.value.field == "missed" and state(job.id) == before


@pytest.mark.django_db(transaction=True)
def test_a_reschedule_waits_for_a_claim_holding_the_row_and_nothing_fires_twice(broker):
    from django.db import connection, transaction

    job = cron_at_scale.schedule(noop, every=1, catchup="all", overlap="allow")
    shift(job, 1)  # one occurrence due now, the next within the claim's look-ahead
    claimed, go = threading.Event(), threading.Event()
    runs: list = []

    def claim():  # a dispatcher's claim transaction (its statements), held open before its commit
        try:
            d = Dispatcher(name="racer", lookahead=1.0)
            d.shards.refresh()
            with transaction.atomic():
                db.run("claim_settings", {"idle_ms": 5000}, fetch="count", retries=0)
                rows = db.run("claim", {"limit": 10, "dispatcher": d.name, "lease": d.lease, "lookahead": 1.0,
                                        **d.shards.claim_params(), **d.queues.claim_params()}, retries=0)
                runs.extend(advance(rows, lease=d.lease, lookahead=1.0))
                claimed.set()
                go.wait(10)
            d.close()
        finally:
            connection.close()

    t = threading.Thread(target=claim)
    t.start()
    assert claimed.wait(10)
    done = threading.Event()

    def change():
        try:
            cron_at_scale.reschedule(job.id, every=5)
        finally:
            done.set()
            connection.close()

    r = threading.Thread(target=change)
    r.start()
    assert not done.wait(0.5)  # blocked on the claim's row lock
    go.set()
    t.join(10)
    r.join(10)
    assert done.is_set()
    # The claim fired the due occurrence (and held the next one, within its look-ahead): the due one
    # stays, the held one does not run; the new schedule starts 5 s after the change.
    by_attempt = dict(attempts(job))
    assert [r.attempt for r in runs] == sorted(by_attempt) == [1, 2]
    assert by_attempt == {1: "dispatched", 2: "skipped"}
    row = state(job.id)
    assert row["interval"] == 5.0 and row["fire_at"] > db_now() + timedelta(seconds=3)
    assert Dispatcher(lookahead=1.0).claim() == []  # nothing due, nothing claimed twice


@pytest.mark.django_db(transaction=True)
def test_a_claim_during_a_reschedule_skips_the_row_then_sees_the_new_schedule(broker):
    from django.db import connection, transaction

    job = cron_at_scale.schedule(noop, every=1)
    shift(job, 1)  # due now
    locked, go = threading.Event(), threading.Event()

    def change():
        try:
            with transaction.atomic():
                cron_at_scale.reschedule(job.id, every=3)
                locked.set()
                go.wait(10)
        finally:
            connection.close()

    t = threading.Thread(target=change)
    t.start()
    assert locked.wait(10)
    # reschedule fired the due occurrence itself (logged in its transaction, not committed yet)
    assert Dispatcher(name="other", lookahead=1.0).claim() == []  # the row is locked: skipped, not waited for
    go.set()
    t.join(10)
    assert attempts(job) == [(1, "dispatched")]  # the occurrence due before the change, fired once
    assert Dispatcher(name="other", lookahead=1.0).claim() == []  # next one: 3 s after the change
    assert state(job.id)["interval"] == 3.0


def test_cron_schedule_update_changes_the_job_holding_the_key():
    from io import StringIO

    from django.core.management import CommandError, call_command

    def run(*args: str) -> str:
        out = StringIO()
        call_command("cron_schedule", "demo.tasks.noop", *args, stdout=out, stderr=StringIO())
        return out.getvalue().strip()

    job_id = run("--cron", "0 9 * * *", "--key", "daily")
    with pytest.raises(CommandError, match=r"cron_expr \('0 9 \* \* \*' there, '0 10 \* \* \*' here\).*update=True"):
        run("--cron", "0 10 * * *", "--key", "daily")
    before = db_now()
    assert run("--cron", "0 10 * * *", "--key", "daily", "--update") == job_id
    job = Job.objects.get(id=job_id)
    assert job.cron_expr == "0 10 * * *" and job.fire_at == next_fire_time("0 10 * * *", "UTC", before)
    with pytest.raises(CommandError, match="--update needs --key"):
        run("--cron", "0 10 * * *", "--update")
    assert Job.objects.count() == 1


def _admin_client(*perms: str):
    from django.contrib.auth.models import Permission, User
    from django.test import Client

    user = User.objects.create_user(f"staff{User.objects.count()}", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="cron_at_scale", codename__in=perms))
    client = Client()
    client.force_login(user)
    return client


def test_the_admin_change_form_edits_a_recurring_schedule_through_reschedule():
    job = cron_at_scale.schedule(noop, cron="0 4 * * *")
    once = cron_at_scale.schedule(noop, countdown=3600)
    url = f"/admin/cron_at_scale/job/{job.id}/change/"
    editor = _admin_client("view_job", "change_job")
    page = editor.get(url).content.decode()
    assert 'name="cron_expr"' in page and 'name="timezone"' in page and 'name="interval"' not in page
    assert 'name="cron_expr"' not in editor.get(f"/admin/cron_at_scale/job/{once.id}/change/").content.decode()

    r = editor.post(url, {"cron_expr": "61 4 * * *", "timezone": "UTC", "_save": "Save"})
    assert r.status_code == 200 and "cron_expr" in r.context["adminform"].form.errors
    assert Job.objects.get(id=job.id).cron_expr == "0 4 * * *"
    before = db_now()
    r = editor.post(url, {"cron_expr": "15 5 * * *", "timezone": "Europe/Paris", "_save": "Save"})
    assert r.status_code == 302
    row = Job.objects.get(id=job.id)
    assert (row.cron_expr, row.timezone) == ("15 5 * * *", "Europe/Paris")
    assert row.fire_at == next_fire_time("15 5 * * *", "Europe/Paris", before)

    viewer = _admin_client("view_job")
    assert 'name="cron_expr"' not in viewer.get(url).content.decode()
    viewer.post(url, {"cron_expr": "0 6 * * *", "timezone": "UTC", "_save": "Save"})
    assert Job.objects.get(id=job.id).cron_expr == "15 5 * * *"

    every = cron_at_scale.schedule(noop, every=60)
    r = editor.post(f"/admin/cron_at_scale/job/{every.id}/change/", {"interval": "5", "_save": "Save"})
    assert r.status_code == 302 and Job.objects.get(id=every.id).interval == 5.0


def test_the_admin_resume_action_asks_what_to_do_with_missed_occurrences():
    job = cron_at_scale.schedule(noop, cron="* * * * *", overlap="allow", catchup_window=600)
    cron_at_scale.pause(job.id)
    shift(job, 3 * 60)
    shifted_fire_at = Job.objects.get(id=job.id).fire_at
    client = _admin_client("view_job", "pause_job")
    form = {"action": "resume_jobs", "_selected_action": [str(job.id)]}
    page = client.post("/admin/cron_at_scale/job/", form)
    assert page.status_code == 200 and 'value="all"' in page.content.decode()
    assert Job.objects.get(id=job.id).status == "paused"  # nothing done before the choice
    client.post("/admin/cron_at_scale/job/", {**form, "post": "yes", "missed": "bogus"})
    assert Job.objects.get(id=job.id).status == "paused"  # an unknown choice shows the page again
    r = client.post("/admin/cron_at_scale/job/", {**form, "post": "yes", "missed": "all"}, follow=True)
    assert "Resumed 1 of 1" in r.content.decode()
    # Every occurrence from the shifted one up to the new fire_at was missed and runs: three, or four
    # when a minute boundary passed while the test ran.
    resumed = Job.objects.get(id=job.id)
    missed = round((resumed.fire_at - shifted_fire_at).total_seconds() / 60)
    assert resumed.status == "pending" and missed in (3, 4)
    assert JobAttempt.objects.filter(job_id=job.id).count() == missed


def test_upsert_reschedules_in_place_and_replaces_a_job_changed_between_one_off_and_recurring():
    from cron_at_scale.api.schedule import build_job
    from cron_at_scale.beat import upsert

    job = cron_at_scale.schedule(noop, every=1, key="beat:poll", overlap="allow")
    shift(job, 1)  # an occurrence of the old schedule due, not claimed yet
    before = db_now()
    action, changed = upsert(build_job(noop, every=30, key="beat:poll", overlap="allow"))
    assert (action, changed.id, changed.interval) == ("updated", job.id, 30.0)
    assert before + timedelta(seconds=30) <= changed.fire_at <= db_now() + timedelta(seconds=30)
    assert attempts(job) == [(1, "dispatched")]  # the due occurrence still fired, once
    action, replaced = upsert(build_job(noop, countdown=60, key="beat:poll"))
    assert action == "updated" and replaced.id != job.id and replaced.schedule_type == "once"
    assert state(job.id)["status"] == "cancelled"


def test_schedule_stores_the_current_spans_trace_context_with_the_callers_transaction():
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("t")
    with tracer.start_as_current_span("request") as span:
        with transaction.atomic():
            job = cron_at_scale.schedule(noop, countdown=60)
        with pytest.raises(RuntimeError), transaction.atomic():  # rolled back with the caller's rows
            gone = cron_at_scale.schedule(noop)
            raise RuntimeError
    ctx = span.get_span_context()
    assert Job.objects.get(id=job.id).trace_context == {
        "traceparent": f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"}
    assert not Job.objects.filter(id=gone.id).exists()
    assert Job.objects.get(id=cron_at_scale.schedule(noop).id).trace_context is None  # no span: nothing stored


def test_reschedule_and_a_keyed_schedule_that_finds_the_live_job_keep_the_first_trace_context():
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("t")
    with tracer.start_as_current_span("first") as first:
        job = cron_at_scale.schedule(noop, countdown=600, key="keeps-its-trace")
    with tracer.start_as_current_span("second") as second:
        again = cron_at_scale.schedule(noop, countdown=600, key="keeps-its-trace")
        cron_at_scale.reschedule(job.id, countdown=900)
    assert first.get_span_context().trace_id != second.get_span_context().trace_id
    ctx = first.get_span_context()
    assert again.id == job.id
    assert Job.objects.get(id=job.id).trace_context == {
        "traceparent": f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"}
