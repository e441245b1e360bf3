"""Celery's ``expires`` (cron_at_scale.policy.expiry): a run not started within it of its scheduled time is
skipped and counted, at the claim, at the worker's start and in the reaper; never run."""

from __future__ import annotations

from datetime import timedelta

import pytest
from demo.tasks import noop
from helpers import RecordingPublisher, sql

import cron_at_scale
from cron_at_scale import ValidationError, worker
from cron_at_scale.api.schedule import db_now
from cron_at_scale.dispatcher import Dispatcher
from cron_at_scale.models import Job, JobAttempt

pytestmark = pytest.mark.django_db


@pytest.fixture
def dispatcher(monkeypatch):
    d = Dispatcher(name="t", lease=30, shards="all", publisher=RecordingPublisher())
    d.published = d.publisher.published
    return d


def age_attempts(seconds: float) -> None:
    """As if the open attempts had waited ``seconds`` more in the broker's queue."""
    sql("UPDATE cron_at_scale_jobattempt SET scheduled_at = scheduled_at - make_interval(secs => %s) "
        "WHERE finished_at IS NULL", [seconds])


def start(run):
    return worker.AttemptWriter().start(str(run.job_id), run.attempt, "w")


def test_expires_is_validated_and_stored_as_seconds():
    now = db_now()
    assert cron_at_scale.schedule(noop, expires=30).options == {"expires": 30}
    assert cron_at_scale.schedule(noop, expires=timedelta(seconds=2.5)).options == {"expires": 2.5}
    assert cron_at_scale.schedule(noop, expires=None).options == {}
    at = now + timedelta(hours=1)
    assert cron_at_scale.schedule(noop, at=at, expires=at + timedelta(seconds=90)).options == {"expires": 90}
    for bad, words in ((0, "above 0"), (-1, "above 0"), (float("nan"), "above 0"), ("30", "above 0"),
                       (True, "above 0"), (now - timedelta(seconds=5), "not after the job's fire_at"),
                       (now.replace(tzinfo=None), "aware")):
        with pytest.raises(ValidationError, match=words) as e:
            cron_at_scale.schedule(noop, expires=bad)
        assert e.value.field == "expires"
    with pytest.raises(ValidationError, match="one-off jobs only") as e:
        cron_at_scale.schedule(noop, cron="* * * * *", expires=now + timedelta(minutes=1))
    assert e.value.field == "expires"
    assert Job.objects.count() == 4  # the refused ones wrote nothing
    jobs = cron_at_scale.schedule_many([{"task": noop.name, "expires": 5}, {"task": noop.name, "expires": 5.0}])
    assert [j.options for j in jobs] == [{"expires": 5}, {"expires": 5}]
    with pytest.raises(ValidationError) as e:
        cron_at_scale.schedule_many([{"task": noop.name, "expires": -5}])
    assert e.value.field == "[0].expires"


def test_a_run_that_waited_past_its_expiry_is_skipped_at_start_and_the_one_off_job_cancelled(dispatcher):
    job = cron_at_scale.schedule(noop, expires=30)
    keep = cron_at_scale.schedule(noop, expires=30)
    runs = {r.job_id: r for r in dispatcher.claim()}
    assert set(runs) == {job.id, keep.id}  # not expired yet: both published
    sql("UPDATE cron_at_scale_jobattempt SET scheduled_at = scheduled_at - interval '31 seconds' WHERE job_id = %s",
        [job.id])
    row = start(runs[job.id])
    assert (row.outcome, row.error) == ("skipped", "expired: not started within 30 s of its occurrence")
    assert start(runs[keep.id]).outcome == "running"
    a = JobAttempt.objects.get(job_id=job.id)
    assert (a.outcome, a.finished_at is not None, a.error) == ("skipped", True, row.error)
    job.refresh_from_db()
    assert (job.status, job.expired_runs, job.locked_until) == ("cancelled", 1, None)
    assert Job.objects.get(id=keep.id).expired_runs == 0
    assert start(runs[job.id]) is None  # a redelivered message starts nothing and counts nothing
    assert Job.objects.get(id=job.id).expired_runs == 1


def test_the_dispatcher_does_not_publish_a_run_already_past_its_expiry(dispatcher):
    now = db_now()
    late = cron_at_scale.schedule(noop, at=now - timedelta(seconds=10), expires=5)
    fresh = cron_at_scale.schedule(noop, at=now - timedelta(seconds=10), expires=60)
    plain = cron_at_scale.schedule(noop, at=now - timedelta(seconds=10))
    runs = dispatcher.claim()
    assert {r.job_id for r in runs} == {fresh.id, plain.id}
    late.refresh_from_db()
    assert (late.status, late.expired_runs) == ("cancelled", 1)
    a = JobAttempt.objects.get(job_id=late.id)
    assert (a.outcome, a.error) == ("skipped", "expired: not started within 5 s of its occurrence")


def test_recurring_runs_past_expiry_are_skipped_and_the_job_stays_pending(dispatcher):
    now = db_now()
    job = cron_at_scale.schedule(noop, every=1, at=now - timedelta(seconds=20), catchup="all",
                                 catchup_window=60, overlap="allow", expires=3)
    runs = dispatcher.claim()
    job.refresh_from_db()
    # 21 occurrences fell due: those older than 3 s expired unpublished, the recent ones go out
    assert job.status == "pending" and job.fire_at > now
    assert all(now - r.fire_at <= timedelta(seconds=3.5) for r in runs) and 1 <= len(runs) <= 5
    skipped = JobAttempt.objects.filter(job_id=job.id, outcome="skipped", error__startswith="expired:")
    assert skipped.count() == job.expired_runs >= 16
    age_attempts(10)  # the published ones waited too long in the queue
    assert [start(r).outcome for r in runs] == ["skipped"] * len(runs)
    job.refresh_from_db()
    assert job.status == "pending"
    assert job.expired_runs == JobAttempt.objects.filter(job_id=job.id, error__startswith="expired:").count()
    assert not JobAttempt.objects.filter(job_id=job.id, outcome="running").exists()


def test_a_lost_run_past_its_expiry_is_not_fired_again(dispatcher):
    once = cron_at_scale.schedule(noop, expires=30)
    other = cron_at_scale.schedule(noop, expires=300)
    cron = cron_at_scale.schedule(noop, every=3600, at=db_now(), expires=30)
    runs = dispatcher.claim()
    assert {r.job_id for r in runs} == {once.id, other.id, cron.id}
    age_attempts(60)
    sql("UPDATE cron_at_scale_job SET fire_at = fire_at - interval '60 seconds' WHERE id IN (%s, %s)",
        [once.id, other.id])
    sql("UPDATE cron_at_scale_jobattempt SET locked_until = statement_timestamp() - interval '1 second'")
    dispatcher.published.clear()
    assert dispatcher.reap() == 3
    assert dispatcher.published == []  # the cron run is not fired again
    c = Job.objects.get(id=cron.id)
    assert (c.status, c.expired_runs) == ("pending", 1)
    assert list(JobAttempt.objects.filter(job_id=cron.id).order_by("attempt").values_list("outcome", flat=True)) \
        == ["lost", "skipped"]
    runs = dispatcher.claim()  # the one-off jobs are due again: the expired one is not published
    assert [r.job_id for r in runs] == [other.id]
    o = Job.objects.get(id=once.id)
    assert (o.status, o.expired_runs) == ("cancelled", 1)
    assert list(JobAttempt.objects.filter(job_id=once.id).order_by("attempt").values_list("outcome", flat=True)) \
        == ["lost", "skipped"]


def test_an_expires_edited_by_hand_into_a_non_number_is_ignored_not_a_crash(dispatcher):
    job = cron_at_scale.schedule(noop, expires=1)
    Job.objects.filter(id=job.id).update(options={"expires": "soon"})  # written by hand, past validation
    (run,) = dispatcher.claim()
    age_attempts(60)
    assert start(run).outcome == "running"
    assert Job.objects.get(id=job.id).expired_runs == 0
