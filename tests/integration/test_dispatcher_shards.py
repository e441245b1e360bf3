"""Shard leases spread the work; correctness never depends on them. Wake-ups and look-ahead."""

from __future__ import annotations

import time

import pytest
from demo.tasks import noop
from helpers import RecordingPublisher, sql

import cron_at_scale
from cron_at_scale.dispatcher import Dispatcher
from cron_at_scale.dispatcher.wakeup import Wakeup
from cron_at_scale.models import NUM_SHARDS, Job, ShardLease

pytestmark = pytest.mark.django_db


def test_one_dispatcher_takes_every_shard_and_claims_unfiltered():
    d = Dispatcher(name="solo")
    d.shards.refresh()
    assert d.shards.all and d.shards.claim_params() == {"shards": list(range(64)), "per_shard": 16,  # 1000 / 64
                                                        "floors": [None] * 64}
    assert ShardLease.objects.filter(owner="solo").count() == NUM_SHARDS


def test_shards_rebalance_when_a_dispatcher_joins_and_move_when_one_stops():
    a, b = Dispatcher(name="a"), Dispatcher(name="b")
    a.shards.refresh()
    assert len(a.shards.owned) == NUM_SHARDS
    b.shards.refresh()  # b is alive now, but a still holds everything
    a.shards.refresh()  # a sees two dispatchers: gives back half
    b.shards.refresh()  # b takes the free half
    assert len(a.shards.owned) == len(b.shards.owned) == NUM_SHARDS // 2
    assert not a.shards.owned & b.shards.owned
    a.shards.release_all()  # a clean stop hands over at once
    b.shards.refresh()
    assert len(b.shards.owned) == NUM_SHARDS


def test_each_dispatcher_claims_only_its_shards():
    jobs = [cron_at_scale.schedule(noop) for _ in range(200)]
    a, b = Dispatcher(name="a", batch_size=1000), Dispatcher(name="b", batch_size=1000)
    for d in (a, b, a, b):
        d.shards.refresh()
    got_a, got_b = a.claim(), b.claim()
    shard_of = dict(Job.objects.values_list("id", "shard"))
    assert {shard_of[c.job_id] for c in got_a} <= a.shards.owned
    assert {shard_of[c.job_id] for c in got_b} <= b.shards.owned
    assert len(got_a) + len(got_b) == len(jobs)


def test_forged_overlapping_leases_still_claim_each_job_once():
    for _ in range(300):
        cron_at_scale.schedule(noop)
    a, b = Dispatcher(name="a", batch_size=7), Dispatcher(name="b", batch_size=7)
    everything = set(range(NUM_SHARDS))
    a.shards.owned = b.shards.owned = everything  # both believe they own every shard
    a._next_shards = b._next_shards = 1e18  # and never look at the lease table
    seen = []
    while batch := a.claim() + b.claim():
        seen += [c.job_id for c in batch]
    assert len(seen) == len(set(seen)) == 300


@pytest.mark.django_db(transaction=True)  # NOTIFY is delivered at commit
def test_a_job_due_now_wakes_the_dispatcher_at_once():
    d = Dispatcher(name="w")
    wakeup = Wakeup()
    assert wakeup.wait(0.05) is False  # LISTEN is set up; nothing yet
    cron_at_scale.schedule_many([{"task": noop} for _ in range(500)])  # one notification, not 500
    started = time.monotonic()
    assert wakeup.wait(5.0) is True
    assert time.monotonic() - started < 1.0
    assert wakeup.wait(0.2) is False  # the bulk insert sent one, not 500
    cron_at_scale.schedule(noop, countdown=3600)  # a future job wakes nobody
    assert wakeup.wait(0.3) is False
    wakeup.close()
    d.wakeup.close()


def test_look_ahead_claims_early_and_publishes_at_fire_at(monkeypatch):
    publisher = RecordingPublisher(stamp=True)
    published = publisher.published
    job = cron_at_scale.schedule(noop, countdown=0.5)
    d = Dispatcher(name="la", lookahead=1.0, eta_lead=0, publisher=publisher)  # no ETA_LEAD: held here until its fire_at
    assert d.tick() == 1  # claimed half a second early ...
    assert published == []  # ... but not sent yet
    deadline = time.monotonic() + 2
    while not published and time.monotonic() < deadline:
        d.fire_timers()
        time.sleep(0.005)
    (sent_at, run), = published
    (fire_at, db_now), = sql("SELECT fire_at, statement_timestamp() FROM cron_at_scale_job WHERE id = %s", [job.id])
    assert run.job_id == job.id
    # sent at its fire_at on the database clock: not early, and within a few ms
    lateness = (db_now - fire_at).total_seconds() - (time.monotonic() - sent_at)
    assert 0 <= lateness < 0.05, lateness


def test_with_an_eta_lead_a_run_claimed_early_goes_out_at_once_with_its_fire_at_as_eta(monkeypatch):
    publisher = RecordingPublisher()
    published = publisher.published
    job = cron_at_scale.schedule(noop, countdown=0.5)
    d = Dispatcher(name="la", lookahead=1.0, eta_lead=1.0, publisher=publisher)
    assert d.tick() == 1
    (run,) = published  # within the lead: sent now, for the worker to hold until its eta
    job.refresh_from_db()
    assert run.job_id == job.id and run.eta == run.fire_at
    assert abs((run.fire_at - job.created_at).total_seconds() - 0.5) < 0.1


def _claim_ahead(d: Dispatcher) -> None:
    """Claims that move every shard's floor: a due job and one within the look-ahead in each."""
    from datetime import timedelta

    from django.utils import timezone

    now = timezone.now()
    # 2,048 random ids: every one of the 64 shards gets some (all but certainly: 64 * e^-32)
    cron_at_scale.schedule_many([{"task": noop, "at": now - timedelta(seconds=30) + timedelta(milliseconds=i)}
                                 for i in range(1024)] + [{"task": noop, "at": now + timedelta(milliseconds=900)}] * 1024)
    while d.claim():
        pass
    assert len(d.shards.floors.floors) == NUM_SHARDS


def test_a_job_due_now_is_claimed_at_once_past_the_floors():
    # Floors sit at most ShardFloors.margin before the claim's database time, even when the
    # claim took runs within the look-ahead: a job scheduled for now is above them.
    d = Dispatcher(name="solo", lookahead=1.0)
    d.shards.floors.sweep = 3600.0
    d.claim()  # the first claim has no floor and starts the sweep's clock
    _claim_ahead(d)
    job = cron_at_scale.schedule(noop)
    assert [c.job_id for c in d.claim()] == [job.id]


def test_a_job_scheduled_into_the_past_below_the_floors_waits_at_most_one_sweep():
    from datetime import timedelta

    from django.utils import timezone

    d = Dispatcher(name="solo", lookahead=1.0)
    d.shards.floors.sweep = 1.0
    d.claim()
    _claim_ahead(d)
    job = cron_at_scale.schedule(noop, at=timezone.now() - timedelta(minutes=5))
    deadline = time.monotonic() + d.shards.floors.sweep + 0.5
    got = []
    while time.monotonic() < deadline and not got:
        got = d.claim()
        time.sleep(0.05)
    assert [c.job_id for c in got] == [job.id]



def test_the_floor_probe_finds_a_job_scheduled_below_the_floors():
    # The dispatcher's probe thread (here one probe, called directly) finds the first due row
    # below each shard's floor and lowers the floor to it; the next claim takes it.
    from datetime import timedelta

    from django.utils import timezone

    d = Dispatcher(name="solo", lookahead=1.0)
    d.shards.floors.sweep = 3600.0  # no sweep by the claim itself
    d.claim()
    _claim_ahead(d)
    job = cron_at_scale.schedule(noop, at=timezone.now() - timedelta(minutes=5))
    assert d.claim() == []  # below every floor
    shard = Job.objects.get(id=job.id).shard
    assert d.floor_probe.probe() == {shard: Job.objects.get(id=job.id).fire_at}
    assert [c.job_id for c in d.claim()] == [job.id]
    assert d.floor_probe.probe() == {}


@pytest.mark.django_db(transaction=True)
def test_held_runs_go_out_on_time_while_the_loop_is_busy_claiming(monkeypatch):
    # Every claim after the first holds the loop for 0.3 s (a slow database, a large batch): a run
    # claimed ahead still goes out at its fire_at, from the timer thread, not after the claim.
    import threading

    from django.db import connections

    publisher = RecordingPublisher(stamp=True)
    published = publisher.published
    real_claim = Dispatcher.claim
    claims = []

    def slow_claim(self):
        out = real_claim(self)
        claims.append(len(out))
        if len(claims) > 1:
            time.sleep(0.3)
        return out

    monkeypatch.setattr(Dispatcher, "claim", slow_claim)
    job = cron_at_scale.schedule(noop, countdown=0.6)
    d = Dispatcher(name="busy", lookahead=1.0, eta_lead=0, poll_interval=0.05, shards="all", publisher=publisher)
    def run():
        try:
            d.run(max_seconds=1.5)
        finally:
            connections.close_all()

    loop = threading.Thread(target=run)
    loop.start()
    loop.join(10)
    assert len(published) == 1 and claims[0] == 1, (published, claims)
    (sent_at, run), = published
    read_at = time.monotonic()  # before the query: its own latency then counts as lateness, never against it
    (fire_at, db_now), = sql("SELECT fire_at, statement_timestamp() FROM cron_at_scale_job WHERE id = %s", [job.id])
    assert run.job_id == job.id
    lateness = (db_now - fire_at).total_seconds() - (read_at - sent_at)
    assert 0 <= lateness < 0.05, lateness
