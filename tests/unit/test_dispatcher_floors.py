"""Where each shard's head starts (ShardFloors): after the claimed rows, never past now - margin."""

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

from cron_at_scale.dispatcher.floors import ShardFloors

NOW = datetime(2026, 3, 29, 1, 0, tzinfo=timezone.utc)


def row(shard: int, seconds: float, schedule_type: str = "once"):
    return SimpleNamespace(shard=shard, fire_at=NOW + timedelta(seconds=seconds), schedule_type=schedule_type)


def test_a_shard_starts_at_the_latest_job_claimed_there():
    f = ShardFloors(margin=2.0, sweep=60.0)
    assert f.params([1, 2]) == {"floors": [None, None]}  # the first claim: no floor
    f.learn([row(1, -50), row(1, -40), row(2, -45)], NOW)
    assert f.params([1, 2, 3]) == {"floors": [NOW - timedelta(seconds=40), NOW - timedelta(seconds=45), None]}


def test_never_past_the_margin_before_the_claims_database_time():
    # runs claimed within the look-ahead: a job scheduled for now, by a transaction that began
    # up to a margin ago, must stay above the floor
    f = ShardFloors(margin=2.0, sweep=60.0)
    f.learn([row(1, -0.5), row(1, 0.9)], NOW)
    assert f.floors[1] == NOW - timedelta(seconds=2)


def test_a_recurring_job_keeps_its_shards_floor_at_or_below_its_old_fire_at():
    f = ShardFloors(margin=2.0, sweep=60.0)
    f.learn([row(1, -30, "cron"), row(1, -10)], NOW)
    assert f.floors[1] == NOW - timedelta(seconds=30)


def test_a_shard_that_gave_nothing_keeps_its_floor_and_a_sweep_clears_them_all():
    f = ShardFloors(margin=2.0, sweep=60.0)
    f.params([1, 2])
    f.learn([row(1, -30), row(2, -20)], NOW)
    f.params([1, 2])
    f.learn([row(2, -10)], NOW + timedelta(seconds=1))
    assert f.floors == {1: NOW - timedelta(seconds=30), 2: NOW - timedelta(seconds=10)}
    f.sweep = 0.0  # the sweep is due: the next claim reads every shard from the start
    assert f.params([1, 2]) == {"floors": [None, None]}
    f.learn([], NOW)  # a claim that took nothing moves nothing
    assert f.floors == {}


def test_a_slow_sweep_spaces_out_the_next_ones():
    # behind a transaction held open, a sweep re-reads every claim since: its cost is kept to
    # `share` of the loop's time, and a row below a floor waits at most max_sweep
    f = ShardFloors(margin=2.0, sweep=5.0, max_sweep=60.0, share=0.05)
    f.params([1])  # a sweep
    f.learn([row(1, -30)], NOW, seconds=0.5)
    assert f.interval == 10.0
    f.learn([row(1, -20)], NOW, seconds=2.0)  # a claim with floors: not a sweep, nothing learnt
    assert f.interval == 10.0
    f.reset()
    f.learn([], NOW, seconds=9.0)
    assert f.interval == 60.0
    f.reset()
    f.learn([], NOW, seconds=0.01)  # quick again: back to every `sweep` seconds
    assert f.interval == 5.0


def test_a_floor_lowered_while_a_claim_ran_stays_lowered():
    # the probe found a row below shard 1's floor while a claim (given the old floor) ran: that
    # claim did not look below the old floor, so what it learns must not raise the floor again
    f = ShardFloors(margin=2.0, sweep=60.0)
    f.params([1, 2])
    f.learn([row(1, -30), row(2, -30)], NOW)
    f.params([1, 2])  # the next claim is given -30 s for both
    f.lower({1: NOW - timedelta(seconds=50), 3: NOW})  # shard 3 has no floor: nothing to lower
    f.learn([row(1, -20), row(2, -20)], NOW)
    assert f.floors == {1: NOW - timedelta(seconds=50), 2: NOW - timedelta(seconds=20)}
    f.params([1, 2])
    f.learn([row(1, -40)], NOW)  # given the lowered floor: it moves on from there
    assert f.floors[1] == NOW - timedelta(seconds=40)
