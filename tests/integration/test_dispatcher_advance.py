"""Recurring jobs through the dispatcher's claim on PostgreSQL: catch-up, overlap, jitter, pause, intervals."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from demo.tasks import noop
from helpers import sql

import cron_at_scale
from cron_at_scale import ValidationError
from cron_at_scale.dispatcher import Dispatcher
from cron_at_scale.models import Job, JobAttempt
from cron_at_scale.sql import run as run_query

pytestmark = pytest.mark.django_db


def shift(job, seconds: float):
    """Move a job's pending occurrence ``seconds`` into the past (as if the dispatchers were down)."""
    sql("UPDATE cron_at_scale_job SET fire_at = fire_at - make_interval(secs => %s), "
        "occurrence_at = occurrence_at - make_interval(secs => %s) WHERE id = %s", [seconds, seconds, job.id])


def finish_open_attempts():
    for job_id, attempt in sql("SELECT job_id, attempt FROM cron_at_scale_jobattempt WHERE finished_at IS NULL"):
        run_query("finish_attempt", {"job_id": job_id, "attempt": attempt, "outcome": "succeeded",
                                     "status": "completed", "error": "", "traceback": ""}, fetch="count")


def test_latest_catchup_after_an_outage_fires_once_and_counts_the_missed():
    job = cron_at_scale.schedule(noop, cron="* * * * *", catchup_window=600)
    shift(job, 30 * 60 + 1)  # 30 minutes of outage
    runs = Dispatcher(lookahead=0).claim()
    assert len(runs) == 1
    row = Job.objects.get(id=job.id)
    assert row.missed_occurrences == 30  # 31 due: one fired, the rest counted
    assert row.fire_at > datetime.now(timezone.utc) - timedelta(seconds=5)


def test_overlap_skip_records_the_occurrence_as_a_skipped_attempt():
    job = cron_at_scale.schedule(noop, cron="* * * * * *")
    shift(job, 1)
    assert len(Dispatcher(lookahead=0).claim()) == 1  # run 1 is now open (dispatched, not finished)
    shift(job, 1)
    assert Dispatcher(lookahead=0).claim() == []
    outcomes = list(JobAttempt.objects.filter(job_id=job.id).order_by("attempt").values_list("outcome", flat=True))
    assert outcomes == ["dispatched", "skipped"]
    assert Job.objects.get(id=job.id).skipped_occurrences == 1


def test_overlap_buffer_one_fires_the_buffered_occurrence_when_the_run_ends():
    job = cron_at_scale.schedule(noop, cron="*/10 * * * * *", overlap="buffer_one")
    shift(job, 10)
    assert len(Dispatcher(lookahead=0).claim()) == 1
    shift(job, 10)
    assert Dispatcher(lookahead=0).claim() == []  # buffered: no attempt row yet
    buffered = Job.objects.get(id=job.id).buffered_at
    assert buffered is not None
    finish_open_attempts()  # the running one ends: the buffered occurrence is due now
    runs = Dispatcher(lookahead=0).claim()
    assert [r.occurrence for r in runs] == [buffered]
    assert Job.objects.get(id=job.id).buffered_at is None


def test_overlap_allow_fires_while_a_run_is_open():
    job = cron_at_scale.schedule(noop, cron="* * * * * *", overlap="allow")
    shift(job, 1)
    assert len(Dispatcher(lookahead=0).claim()) == 1
    shift(job, 1)
    assert len(Dispatcher(lookahead=0).claim()) == 1


def test_jitter_moves_fire_at_within_the_gap_and_keeps_the_occurrence():
    job = cron_at_scale.schedule(noop, cron="0 0 * * *", jitter=3600)
    row = Job.objects.get(id=job.id)
    assert row.occurrence_at.hour == 0 and row.occurrence_at.minute == 0
    assert row.occurrence_at <= row.fire_at < row.occurrence_at + timedelta(hours=1)


def test_a_run_carries_its_nominal_occurrence():
    job = cron_at_scale.schedule(noop, cron="* * * * *", jitter=50)
    shift(job, 120)
    runs = Dispatcher(lookahead=0).claim()
    assert len(runs) == 1
    run = runs[0]
    assert run.occurrence.second == 0 and run.occurrence.microsecond == 0
    assert run.occurrence <= run.fire_at < run.occurrence + timedelta(seconds=50)
    assert JobAttempt.objects.get(job_id=job.id).scheduled_at == run.fire_at


def test_pause_holds_a_job_and_resume_follows_the_catchup_policy():
    job = cron_at_scale.schedule(noop, cron="* * * * *", catchup="skip")
    assert cron_at_scale.pause(job.id, note="maintenance")
    assert not cron_at_scale.pause(job.id)
    row = Job.objects.get(id=job.id)
    assert (row.status, row.pause_note) == ("paused", "maintenance")
    shift(job, 5 * 60)
    assert Dispatcher(lookahead=0).claim() == []  # paused: nothing fires
    assert cron_at_scale.resume(job.id)
    assert Dispatcher(lookahead=0).claim() == []  # skip: five missed occurrences are not fired
    assert Job.objects.get(id=job.id).missed_occurrences == 5
    once = cron_at_scale.schedule(noop, countdown=60)
    assert not cron_at_scale.pause(once.id)  # only recurring jobs pause


def test_paused_jobs_keep_their_key_and_can_be_cancelled():
    job = cron_at_scale.schedule(noop, cron="@daily", key="nightly")
    cron_at_scale.pause(job.id)
    assert cron_at_scale.schedule(noop, cron="@daily", key="nightly").id == job.id
    assert cron_at_scale.cancel(job.id)


def test_interval_jobs_fire_every_n_seconds_from_the_schedule():
    start = datetime.now(timezone.utc) + timedelta(hours=1)
    job = cron_at_scale.schedule(noop, every=timedelta(seconds=90), at=start)
    row = Job.objects.get(id=job.id)
    assert (row.schedule_type, row.interval, row.fire_at) == ("interval", 90.0, start)
    shift(job, 3600 + 1)
    assert len(Dispatcher(lookahead=0).claim()) == 1
    # 90 s after the scheduled occurrence it fired, not after "now"
    assert Job.objects.get(id=job.id).fire_at == start - timedelta(seconds=3601) + timedelta(seconds=90)


def test_run_now_on_a_cron_job_is_one_extra_run():
    job = cron_at_scale.schedule(noop, cron="0 0 1 1 *")
    sql("UPDATE cron_at_scale_job SET fire_at = statement_timestamp() WHERE id = %s", [job.id])
    runs = Dispatcher(lookahead=0).claim()
    assert len(runs) == 1
    row = Job.objects.get(id=job.id)
    assert row.fire_at == row.occurrence_at and row.fire_at.month == 1  # the schedule is untouched


@pytest.mark.parametrize(("spec", "field"), [
    (dict(cron="* * * * *", catchup="sometimes"), "catchup"),
    (dict(cron="* * * * *", overlap="queue"), "overlap"),
    (dict(cron="* * * * *", jitter=-1), "jitter"),
    (dict(cron="* * * * *", catchup_window="5m"), "catchup_window"),
    (dict(every=0), "every"),
    (dict(every="10s"), "every"),
    (dict(countdown=5, jitter=10), "jitter"),
    (dict(overlap="allow"), "overlap"),
    (dict(every=10, cron="* * * * *"), "every"),
])
def test_bad_policy_input_names_the_field(spec, field):
    with pytest.raises(ValidationError) as err:
        cron_at_scale.schedule(noop, **spec)
    assert err.value.field == field
    assert Job.objects.count() == 0


def _month_ends(now: datetime) -> list[datetime]:
    """Midnight UTC of the last day of the months around ``now`` (from the calendar, not from cron)."""
    import calendar

    ends = []
    for back in range(-4, 4):
        y, m = divmod(now.year * 12 + now.month - 1 + back, 12)
        ends.append(datetime(y, m + 1, calendar.monthrange(y, m + 1)[1], tzinfo=timezone.utc))
    return ends


def test_a_last_day_of_month_job_advances_to_the_next_last_day():
    """``0 0 L * *`` through schedule() and the dispatcher's claim: a due occurrence fires and the job
    moves to the next month's last day (months of 30 and 31 days, February)."""
    ((now,),) = sql("SELECT statement_timestamp()")
    ends = _month_ends(now)
    past, future = [e for e in ends if e <= now], [e for e in ends if e > now]
    job = cron_at_scale.schedule(noop, cron="0 0 L * *", catchup_window=40 * 86400)
    row = Job.objects.get(id=job.id)
    assert row.occurrence_at == row.fire_at == future[0]
    sql("UPDATE cron_at_scale_job SET fire_at = %s, occurrence_at = %s WHERE id = %s", [past[-1], past[-1], job.id])
    runs = Dispatcher(lookahead=0).claim()
    assert [r.occurrence for r in runs] == [past[-1]]
    row = Job.objects.get(id=job.id)
    assert (row.occurrence_at, row.fire_at, row.missed_occurrences) == (future[0], future[0], 0)
    # catch-up 'all' from two month-ends back: both fire, in order, then the next one is pending
    every = cron_at_scale.schedule(noop, cron="0 0 L * *", catchup="all", overlap="allow",
                                   catchup_window=70 * 86400)
    sql("UPDATE cron_at_scale_job SET fire_at = %s, occurrence_at = %s WHERE id = %s", [past[-2], past[-2], every.id])
    runs = Dispatcher(lookahead=0).claim()
    assert [r.occurrence for r in runs] == past[-2:]
    assert Job.objects.get(id=every.id).occurrence_at == future[0]


@pytest.mark.parametrize(("cron", "part"), [
    ("0 0 1,L * *", "day-of-month"), ("0 0 * * 2#6", "day-of-week"), ("L * * * *", "minute"),
    ("* * 30W 2 *", "day-of-month"), ("0 0 L-31 * *", "day-of-month"), ("0 0 * * 3W", "day-of-week"),
])
def test_bad_quartz_forms_are_refused_by_schedule(cron, part):
    with pytest.raises(ValidationError) as err:
        cron_at_scale.schedule(noop, cron=cron)
    assert err.value.field == "cron" and part in str(err.value)
    with pytest.raises(ValidationError) as err:
        cron_at_scale.schedule_many([{"task": noop.name, "cron": "0 0 L * *"}, {"task": noop.name, "cron": cron}])
    assert err.value.field == "[1].cron" and part in str(err.value)
    assert Job.objects.count() == 0
