"""The claim, in process, against PostgreSQL: what is due, leases, attempt rows, cron advance."""

from __future__ import annotations

from datetime import timedelta

import pytest
from demo.tasks import noop
from helpers import sql

import cron_at_scale
from cron_at_scale.cron import next_fire_times
from cron_at_scale.dispatcher import Dispatcher
from cron_at_scale.models import Job, JobAttempt

pytestmark = pytest.mark.django_db


def make_due(job, seconds_ago=1.0):
    sql("UPDATE cron_at_scale_job SET fire_at = statement_timestamp() - make_interval(secs => %s) WHERE id = %s",
        [seconds_ago, job.id])


def test_claims_only_due_jobs_and_writes_attempts_with_a_lease():
    due = [cron_at_scale.schedule(noop) for _ in range(3)]
    later = cron_at_scale.schedule(noop, countdown=3600)
    d = Dispatcher(name="d1", batch_size=10, lease=30)
    batch = d.claim()
    assert len(d.shards.owned) == 64, f"another dispatcher is alive: {sql('SELECT * FROM cron_at_scale_dispatcherheartbeat')}"
    while d.more_due:  # a shard's head gives ceil(10 / 64) = 1 row a claim: two jobs of one shard take two (as the loop does)
        batch += d.claim()
    assert sorted(str(c.job_id) for c in batch) == sorted(str(j.id) for j in due)
    assert all(c.attempt == 1 for c in batch)
    for job in due:
        row = Job.objects.get(id=job.id)
        assert row.status == "in_progress" and row.locked_by == "d1" and row.attempts == 1
        attempt = JobAttempt.objects.get(job_id=job.id)
        assert attempt.attempt == 1 and attempt.outcome == "dispatched" and attempt.scheduled_at == row.fire_at
        lease = (attempt.locked_until - attempt.dispatched_at).total_seconds()
        assert lease == pytest.approx(30, abs=0.01)
    assert Job.objects.get(id=later.id).status == "pending"
    assert Dispatcher(name="d2").claim() == []  # nothing due is left


def test_batch_size_bounds_one_claim_and_oldest_fire_first():
    jobs = [cron_at_scale.schedule(noop) for _ in range(5)]
    for i, job in enumerate(jobs):
        make_due(job, seconds_ago=10 - i)
    d = Dispatcher(batch_size=2)
    batches = [d.claim() for _ in range(5)]
    assert len(batches[0]) == 2 and all(len(b) <= 2 for b in batches)
    assert str(batches[0][0].job_id) == str(jobs[0].id)  # the oldest first
    # A batch takes the earliest of each shard's head (ShardHeads): a job of a shard that already
    # gave its share waits for the next claim, but a shard's own jobs go out in fire_at order.
    order = [str(c.job_id) for b in batches for c in b]
    assert sorted(order) == sorted(str(j.id) for j in jobs)
    by_shard: dict[int, list[str]] = {}
    for job in jobs:
        by_shard.setdefault(Job.objects.get(id=job.id).shard, []).append(str(job.id))
    for same_shard in by_shard.values():
        assert [i for i in order if i in same_shard] == same_shard


def test_due_ness_ignores_this_process_clock(monkeypatch):
    import time as time_module

    from django.utils import timezone as dj_timezone

    job = cron_at_scale.schedule(noop, countdown=5)
    # The ways a node's clock could leak in: Django's timezone.now() (what ORM code would
    # use) and time.time(), both an hour fast. (tests/faults scenario 6 skews whole processes.)
    real_now = dj_timezone.now
    monkeypatch.setattr(dj_timezone, "now", lambda: real_now() + timedelta(hours=1))
    monkeypatch.setattr(time_module, "time", lambda real=time_module.time: real() + 3600)
    assert Dispatcher().claim() == []  # an hour-fast clock fires nothing early
    make_due(job)
    assert len(Dispatcher().claim()) == 1


def test_cron_job_moves_on_from_its_scheduled_fire_at_without_drift():
    job = cron_at_scale.schedule(noop, cron="*/10 * * * * *")
    scheduled = Job.objects.get(id=job.id).fire_at
    sql("UPDATE cron_at_scale_job SET fire_at = fire_at - interval '10 seconds', "
        "occurrence_at = occurrence_at - interval '10 seconds' WHERE id = %s", [job.id])
    first = scheduled - timedelta(seconds=10)
    batch = Dispatcher(lookahead=0).claim()  # no look-ahead: the next occurrence may be under a second away
    assert len(batch) == 1 and batch[0].fire_at == first
    row = Job.objects.get(id=job.id)
    assert row.status == "pending"  # a cron job stays pending; the run lives on its attempt
    assert row.fire_at == next_fire_times("*/10 * * * * *", "UTC", first, 1)[0] == scheduled
    assert JobAttempt.objects.get(job_id=job.id, attempt=1).scheduled_at == first


def test_two_dispatchers_in_one_database_never_share_a_job():
    for _ in range(50):
        cron_at_scale.schedule(noop)
    a, b = Dispatcher(name="a", batch_size=20), Dispatcher(name="b", batch_size=20)
    seen = []
    while True:
        got = a.claim() + b.claim()
        if not got:
            break
        seen += [c.job_id for c in got]
    assert len(seen) == len(set(seen)) == 50


@pytest.mark.django_db(transaction=True)  # the server ends the claim's session: not the test's own transaction
def test_a_claim_left_idle_in_its_transaction_is_ended_by_the_server_and_publishes_nothing(settings):
    import time

    from django.db import InterfaceError, OperationalError, connection
    from helpers import RecordingPublisher, is_claim

    from cron_at_scale import sql as db

    settings.CRON_AT_SCALE = {"SHARD_LEASE": 1.0}  # the claim's idle timeout
    jobs = [cron_at_scale.schedule(noop) for _ in range(3)]
    d = Dispatcher(name="stalls", publisher=RecordingPublisher())
    stalled: list[float] = []

    def stall(execute, query, params, many, context):
        result = execute(query, params, many, context)
        if is_claim(query) and not stalled:
            stalled.append(time.monotonic())
            time.sleep(1.6)  # idle in the claim's transaction, its rows locked, past the timeout
        return result

    with connection.execute_wrapper(stall), pytest.raises((OperationalError, InterfaceError)):
        d.tick()
    assert stalled and d.publisher.published == []
    db.reset_connection()
    assert sorted(Job.objects.values_list("status", flat=True)) == ["pending"] * 3  # the claim rolled back
    assert not JobAttempt.objects.exists()
    assert d.tick() == 3  # claimed again, as attempt 1
    assert sorted((str(c.job_id), c.attempt) for c in d.publisher.published) == sorted((str(j.id), 1) for j in jobs)
